package classify

import (
	"go.opentelemetry.io/otel/metric"
)

// ScopeName is the instrumentation scope of the metrics recorded here.
const ScopeName = "github.com/inmesh/inmesh/classify"

// Option configures [NewHandler] and [NewTransport].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	mp             metric.MeterProvider
	classifier     *Classifier
	maxAuthorities int
}

// DefaultMaxAuthorities bounds the distinct authority label values; past
// it, requests are labelled authority="other".
const DefaultMaxAuthorities = 1000

func newConfig(opts []Option) config {
	c := config{maxAuthorities: DefaultMaxAuthorities}
	for _, o := range opts {
		if o != nil {
			o.apply(&c)
		}
	}
	return c
}

// WithMeterProvider sets the meter provider; nil (the default) means the
// global one, which records nothing until the application sets one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) {
		if mp != nil {
			c.mp = mp
		}
	})
}

// WithClassifier sets the classifier for requests whose context carries
// none (default: the zero Classifier's rules).
func WithClassifier(cl *Classifier) Option {
	return optionFunc(func(c *config) {
		if cl != nil {
			c.classifier = cl
		}
	})
}

// WithMaxAuthorities bounds the distinct values of the authority label
// (default [DefaultMaxAuthorities]); n <= 0 changes nothing.
func WithMaxAuthorities(n int) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxAuthorities = n
		}
	})
}
