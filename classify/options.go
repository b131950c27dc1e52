package classify

import (
	"time"

	"github.com/inmesh/inmesh/internal/registry"
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
	idleTimeout    time.Duration
	labels         *Labels
	only           []string
}

// DefaultMaxAuthorities bounds the distinct authority label values; past
// it, requests are labelled authority="other".
const DefaultMaxAuthorities = registry.DefaultMaxEntries

// DefaultIdleTimeout is how long the metric targets of an authority no
// request used are kept.
const DefaultIdleTimeout = registry.DefaultIdle

func newConfig(opts []Option) config {
	c := config{maxAuthorities: DefaultMaxAuthorities, idleTimeout: DefaultIdleTimeout}
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

// WithDefaultLabels sets the extra labels of requests whose context
// carries none ([WithLabels]); nil (the default) means none. A handler
// whose requests mostly share one label set (an inbound stack's
// plaintext clients) gives it here, so that those requests need no
// context of their own.
func WithDefaultLabels(l *Labels) Option {
	return optionFunc(func(c *config) { c.labels = l })
}

// WithMaxAuthorities bounds the distinct values of the authority label
// over the life of the handler or transport (default
// [DefaultMaxAuthorities]), and the authorities whose metric targets are
// kept at once. The label is the authority normalised to host:port (port
// 80 when the request names none); requests for further authorities, or
// with an authority that is not a valid host:port, are labelled
// authority="other". n <= 0 changes nothing.
func WithMaxAuthorities(n int) Option {
	return optionFunc(func(c *config) {
		if n > 0 {
			c.maxAuthorities = n
		}
	})
}

// WithAuthorities labels only these authorities (normalised as the label
// is, host:port); a request for any other authority is labelled
// authority="other" and takes none of the bound of [WithMaxAuthorities].
// It is for a server, whose requests name whatever authority their
// clients chose: without it, the first authorities clients name take the
// label values, and a client naming many can leave the server's own
// authority under other for the life of the handler.
func WithAuthorities(authorities ...string) Option {
	return optionFunc(func(c *config) { c.only = append(c.only, authorities...) })
}

// WithIdleTimeout sets how long the metric targets of an authority no
// request used are kept (default [DefaultIdleTimeout]); they are rebuilt,
// with the same labels, when it is used again. d <= 0 changes nothing.
func WithIdleTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d > 0 {
			c.idleTimeout = d
		}
	})
}
