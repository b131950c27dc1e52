package metrics

import (
	"context"
	"reflect"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Sum is a monotonic counter kept in memory, one atomic integer per
// series, and reported to the meter as an observable counter when a
// reader collects. Adding to a series is one atomic add: the SDK's
// per-measurement work (resolving and de-duplicating the attribute set,
// finding the series) is paid once per series per collection instead of
// once per request. Through the Prometheus exporter a Sum is the same
// counter a synchronous one would be.
//
// Every family created under one name on one meter shares one Sum, so
// that two stacks recording the same labels add to one series, as they
// would with the SDK's own counter. Series are never forgotten, as
// cumulative series in the SDK are not, and they are bounded as the SDK
// bounds them: past [MaxSeries] label sets a Sum counts into one series
// labelled otel.metric.overflow="true".
type Sum struct {
	inst metric.Int64ObservableCounter

	mu       sync.Mutex
	bySet    map[attribute.Distinct]*Series
	list     []*Series // in creation order; append-only
	overflow *Series
}

// MaxSeries is the number of label sets a [Sum] keeps, its overflow series
// included: two series for each of the 10,000 authorities the library
// labels at most by default, and their "other". A router allowed more
// authorities than that (WithMaxAuthorities) overflows here before the
// SDK's own limit would.
const MaxSeries = 2 * (10000 + 1)

var overflowSet = attribute.NewSet(attribute.Bool("otel.metric.overflow", true))

// Series is one label set of a [Sum].
type Series struct {
	n   atomic.Int64
	obs []metric.ObserveOption
}

// Add counts one event.
func (s *Series) Add() { s.n.Add(1) }

type sumKey struct {
	meter metric.Meter
	name  string
}

var sums sync.Map // sumKey -> *Sum

// NewSum returns the Sum named name on meter, creating and registering it
// on first use. Errors go to otel.Handle; the Sum then counts without
// reporting.
func NewSum(meter metric.Meter, name, help string) *Sum {
	// A meter of a type that cannot be a map key gets a Sum of its own.
	// The map holds every Sum for the life of the process, as a
	// MeterProvider holds its instruments.
	t := reflect.TypeOf(meter)
	shared := t != nil && t.Comparable()
	key := sumKey{meter, name}
	if shared {
		if s, ok := sums.Load(key); ok {
			return s.(*Sum)
		}
	}
	s := &Sum{bySet: make(map[attribute.Distinct]*Series)}
	inst, err := meter.Int64ObservableCounter(name, metric.WithDescription(help))
	if err != nil {
		otel.Handle(err)
		return s
	}
	s.inst = inst
	if shared {
		if prev, loaded := sums.LoadOrStore(key, s); loaded {
			return prev.(*Sum)
		}
	}
	if _, err := meter.RegisterCallback(s.observe, inst); err != nil {
		otel.Handle(err)
	}
	return s
}

// Series returns the series of set, creating it on first use.
func (s *Sum) Series(set attribute.Set) *Series {
	key := set.Equivalent()
	s.mu.Lock()
	defer s.mu.Unlock()
	if se := s.bySet[key]; se != nil {
		return se
	}
	if len(s.list) >= MaxSeries-1 {
		if s.overflow == nil {
			s.overflow = &Series{obs: []metric.ObserveOption{metric.WithAttributeSet(overflowSet)}}
			s.list = append(s.list, s.overflow)
		}
		return s.overflow
	}
	se := &Series{obs: []metric.ObserveOption{metric.WithAttributeSet(set)}}
	s.bySet[key] = se
	s.list = append(s.list, se)
	return se
}

func (s *Sum) observe(_ context.Context, o metric.Observer) error {
	s.mu.Lock()
	list := s.list // entries below len never change
	s.mu.Unlock()
	for _, se := range list {
		// A series exists once something is counted, as with the SDK's
		// own counters.
		if n := se.n.Load(); n > 0 {
			o.ObserveInt64(s.inst, n, se.obs...)
		}
	}
	return nil
}
