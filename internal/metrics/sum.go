package metrics

import (
	"context"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"unique"
	"weak"

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
	meter metric.Meter
	inst  metric.Int64Observable
	gauge bool // a gauge: its series go up and down, and 0 is reported

	mu       sync.Mutex
	bySet    map[attribute.Distinct]*Series
	byResp   map[responseKey]*Series // the series of responseSeries
	list     []*Series               // in creation order; append-only
	overflow *Series
}

// responseKey identifies a series of [Sum.responseSeries]: its base
// labels and its response, the latter as a handle: a word where the
// response is five, for each of thousands of series.
type responseKey struct {
	base attribute.Distinct
	r    unique.Handle[Response]
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
	n atomic.Int64
	// obs is the option of the series' set, in an array of its own
	// rather than a slice: one allocation less for each series. It is
	// nil for a series whose set is built when a reader collects (resp).
	obs [1]metric.ObserveOption
	// resp is the base labels and response of a series whose set is
	// built when a reader collects, nil for any other.
	resp *responseLabels
}

// responseLabels are the labels of a response series: its target's base
// labels and the response's. The set is made when a reader collects, not
// kept: a response_total series would otherwise hold a dozen labels
// (status, classification, grpc_status, error beside the base) for each
// of thousands of names, while a reader needs them only while it
// collects, and the SDK does not keep an observed set past a collection.
//
// A series of a target's base labels alone, whose labels are kept as lists
// (see [NewTargetsWith]), is built the same way, with no response.
type responseLabels struct {
	base *baseLabels
	r    unique.Handle[Response] // the zero handle: no response labels
}

// set returns the set of the series' labels.
func (l *responseLabels) set() attribute.Set {
	if l.r == (unique.Handle[Response]{}) {
		return l.base.attrs()
	}
	_, all := responseKVs(l.base, l.r.Value())
	return attribute.NewSet(all...)
}

// Add counts one event.
func (s *Series) Add() { s.n.Add(1) }

// AddN adds n (a gauge's series may go down).
func (s *Series) AddN(n int64) { s.n.Add(n) }

// sumKey finds the Sum of a name on a meter. A meter that is a pointer
// (the SDK's) is keyed by its address, so that the map does not keep it,
// or the MeterProvider behind it, alive: the Sum is then held weakly, and
// an entry goes once its Sum is unreachable (the provider shut down and
// dropped, the families gone). Any other comparable meter (the no-op one)
// is the key itself.
type sumKey struct {
	meter any
	addr  uintptr
	typ   reflect.Type
	name  string
	gauge bool
}

// sums maps a sumKey to a *Sum (value meters) or a weak.Pointer[Sum]
// (pointer meters).
var sums sync.Map

// sumEntry is what the cleanup of a weakly held Sum removes.
type sumEntry struct {
	key sumKey
	ref weak.Pointer[Sum]
}

func loadSum(key sumKey) (*Sum, any) {
	v, ok := sums.Load(key)
	if !ok {
		return nil, nil
	}
	if ref, ok := v.(weak.Pointer[Sum]); ok {
		return ref.Value(), v
	}
	return v.(*Sum), v
}

// NewSum returns the Sum named name on meter, creating and registering it
// on first use. Errors go to otel.Handle; the Sum then counts without
// reporting. A Sum lives as long as its meter's provider or its users do,
// never longer.
func NewSum(meter metric.Meter, name, help string) *Sum { return newSum(meter, name, help, false) }

// NewGauge returns a gauge named name on meter, kept as a [Sum] is: one
// atomic integer per series, which goes up and down, reported (at 0 too)
// once the series exists.
func NewGauge(meter metric.Meter, name, help string) *Sum { return newSum(meter, name, help, true) }

func newSum(meter metric.Meter, name, help string, gauge bool) *Sum {
	// A meter of a type that cannot be a map key gets a Sum of its own.
	var key sumKey
	shared, weakly := false, false
	if v := reflect.ValueOf(meter); v.IsValid() {
		switch {
		case v.Kind() == reflect.Pointer:
			key, shared, weakly = sumKey{addr: v.Pointer(), typ: v.Type(), name: name, gauge: gauge}, true, true
		case v.Type().Comparable():
			key, shared = sumKey{meter: meter, name: name, gauge: gauge}, true
		}
	}
	if shared {
		if s, _ := loadSum(key); s != nil {
			return s
		}
	}
	// s keeps its meter, so that the address it is keyed by is not
	// reused while it lives.
	s := &Sum{meter: meter, bySet: make(map[attribute.Distinct]*Series), gauge: gauge}
	var inst metric.Int64Observable
	var err error
	if gauge {
		inst, err = meter.Int64ObservableGauge(name, metric.WithDescription(help))
	} else {
		inst, err = meter.Int64ObservableCounter(name, metric.WithDescription(help))
	}
	if err != nil {
		otel.Handle(err)
		return s
	}
	s.inst = inst
	if shared {
		var val any = s
		if weakly {
			ref := weak.Make(s)
			val = ref
			runtime.AddCleanup(s, func(e sumEntry) { sums.CompareAndDelete(e.key, e.ref) }, sumEntry{key, ref})
		}
		for {
			prev, loaded := sums.LoadOrStore(key, val)
			if !loaded {
				break
			}
			if ps, _ := loadSum(key); ps != nil {
				return ps
			}
			// The entry of a Sum already collected: replace it.
			if sums.CompareAndSwap(key, prev, val) {
				break
			}
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
		return s.overflowLocked()
	}
	se := &Series{obs: [1]metric.ObserveOption{metric.WithAttributeSet(set)}}
	s.bySet[key] = se
	s.list = append(s.list, se)
	return se
}

// baseSeries returns the series of base's labels, as [Sum.Series] does;
// when some are kept beside their set, the series' set is built when a reader
// collects.
func (s *Sum) baseSeries(base *baseLabels) *Series {
	if base.shared == nil {
		return s.Series(base.set)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if se := s.bySet[base.key]; se != nil {
		return se
	}
	if len(s.list) >= MaxSeries-1 {
		return s.overflowLocked()
	}
	se := &Series{resp: &responseLabels{base: base}}
	s.bySet[base.key] = se
	s.list = append(s.list, se)
	return se
}

// responseSeries returns the series of base's labels and r's response
// labels (see [Target]), creating it on first use. Its set is built when
// a reader collects. The series of one label set are one whichever way
// they were asked for only if they all are response series, as with the
// families of [NewFamily].
func (s *Sum) responseSeries(base *baseLabels, r Response) *Series {
	// Responses that label alike are one series.
	if r.Status < 100 || r.Status > 599 {
		r.Status = 0
	}
	if r.GRPC < 0 {
		r.GRPC = -1
	}
	key := responseKey{base.key, unique.Make(r)}
	s.mu.Lock()
	defer s.mu.Unlock()
	if se := s.byResp[key]; se != nil {
		return se
	}
	if len(s.list) >= MaxSeries-1 {
		return s.overflowLocked()
	}
	se := &Series{resp: &responseLabels{base: base, r: key.r}}
	if s.byResp == nil {
		s.byResp = make(map[responseKey]*Series)
	}
	s.byResp[key] = se
	s.list = append(s.list, se)
	return se
}

// overflowLocked returns the overflow series, creating it on first use.
func (s *Sum) overflowLocked() *Series {
	if s.overflow == nil {
		s.overflow = &Series{obs: [1]metric.ObserveOption{metric.WithAttributeSet(overflowSet)}}
		s.list = append(s.list, s.overflow)
	}
	return s.overflow
}

func (s *Sum) observe(_ context.Context, o metric.Observer) error {
	s.mu.Lock()
	list := s.list // entries below len never change
	s.mu.Unlock()
	for _, se := range list {
		// A series exists once something is counted, as with the SDK's
		// own counters; a gauge's once it was made.
		n := se.n.Load()
		switch {
		case n <= 0 && !s.gauge:
		case se.resp != nil:
			o.ObserveInt64(s.inst, n, metric.WithAttributeSet(se.resp.set()))
		default:
			o.ObserveInt64(s.inst, n, se.obs[:]...)
		}
	}
	return nil
}
