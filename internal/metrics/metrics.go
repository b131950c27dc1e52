// Package metrics holds the Linkerd-shaped HTTP metric families that
// classify and profiles record through the OpenTelemetry metric API, and the
// caches of attribute sets that keep recording free of allocations.
//
// A family is request_total, response_total and (optionally)
// response_latency_ms under a prefix ("", "route_", "route_actual_"). A
// [Target] is one set of base labels (direction, authority or dst, rt_*);
// the response labels (status_code, classification, grpc_status, error) are
// added per response from a bounded cache.
package metrics

import (
	"context"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// LatencyBucketsMs are Linkerd's response_latency_ms bucket bounds.
var LatencyBucketsMs = []float64{1, 2, 3, 4, 5, 10, 20, 30, 40, 50, 100, 200, 300, 400, 500,
	1000, 2000, 3000, 4000, 5000, 10000, 20000, 30000, 40000, 50000}

// Help strings of the families, as Linkerd writes them.
const (
	requestHelp  = "Total count of HTTP requests."
	responseHelp = "Total count of HTTP responses."
	latencyHelp  = "Elapsed times between a request's headers being received and its response stream completing"
)

// Family is one prefix's set of instruments. It is safe for concurrent use.
type Family struct {
	requests  *Sum
	responses *Sum
	latency   metric.Float64Histogram // nil without latency
}

// NewFamily creates the instruments named prefix+request_total and so on,
// its counters kept in memory ([Sum], at most [MaxSeries] label sets
// each). Errors go to otel.Handle; the family then records into no-op
// instruments.
func NewFamily(meter metric.Meter, prefix string, withLatency bool) *Family {
	f := &Family{
		requests:  NewSum(meter, prefix+"request_total", requestHelp),
		responses: NewSum(meter, prefix+"response_total", responseHelp),
	}
	if withLatency {
		var err error
		if f.latency, err = meter.Float64Histogram(prefix+"response_latency_ms", metric.WithDescription(latencyHelp),
			metric.WithUnit("ms"), metric.WithExplicitBucketBoundaries(LatencyBucketsMs...)); err != nil {
			otel.Handle(err)
		}
	}
	return f
}

// Response identifies the response labels of one series.
type Response struct {
	// Status is the HTTP status, 0 when no response head arrived.
	Status int
	// Failure is the classification.
	Failure bool
	// GRPC is the gRPC status code, -1 when none.
	GRPC int32
	// Err is the error label: "", "timeout", "h2(REASON)", "unclassified".
	Err string
}

// Aborted is the response of a handler that panicked after writing status
// (0 for none): a failure that no class describes.
func Aborted(status int) Response {
	return Response{Status: status, Failure: true, GRPC: -1, Err: "unclassified"}
}

// maxResponseSeries bounds the response label combinations of a target;
// past it responses are counted under the last combination's overflow key.
const maxResponseSeries = 512

var overflow = Response{Status: 0, Failure: true, GRPC: -1, Err: "overflow"}

// Target is a family with fixed base labels. It is safe for concurrent use.
type Target struct {
	fam      *Family
	labels   *labelSets
	idx      int // the target's place among those of labels
	requests *Series
}

// labelSets are the attribute sets of one list of base labels and the
// series of its targets, built on first use and shared by the targets
// made together with [NewTargets]: a route's series and its actual
// attempts' have the same labels, and a proxy holds them for each of
// thousands of names.
type labelSets struct {
	base *baseLabels
	n    int // targets

	mu sync.RWMutex
	// few are the first responses' sets, looked up in order: most
	// targets see one or two responses, and a map of one entry costs
	// more than the sets it finds. more holds the rest.
	few  []*responseSets
	more map[Response]*responseSets
}

// baseLabels are the base labels of targets, immutable: a set, and
// labels kept as they were given beside it (see [NewTargetsWith]), never
// a copy of those in the set too. A copy would cost as much again for
// every name; the slow paths that need all of them (a new response, a
// collection, AddOptions) build what they need. The series of a [Sum]
// refer to them, not to the targets' response sets, so that a series
// outliving its targets keeps only its labels.
type baseLabels struct {
	set    attribute.Set
	shared []attribute.KeyValue // nil: the set is all of them
	key    attribute.Distinct   // the set of all of them's
}

// appendTo appends the labels to kvs, in no particular order; a key
// given twice is the later one's, as in [attribute.NewSet].
func (b *baseLabels) appendTo(kvs []attribute.KeyValue) []attribute.KeyValue {
	for it := b.set.Iter(); it.Next(); {
		kvs = append(kvs, it.Attribute())
	}
	return append(kvs, b.shared...)
}

// len is the number of labels appendTo appends.
func (b *baseLabels) len() int { return b.set.Len() + len(b.shared) }

// attrs returns the set of all the labels, building it when some are
// kept beside the set.
func (b *baseLabels) attrs() attribute.Set {
	if b.shared == nil {
		return b.set
	}
	return attribute.NewSet(b.appendTo(make([]attribute.KeyValue, 0, b.len()))...)
}

// fewResponses is how many response sets a target keeps in its list
// before it needs a map.
const fewResponses = 4

// responseSets are the sets of one response, and its series in each
// target's family (made on the target's first such response).
type responseSets struct {
	r      Response
	record []metric.RecordOption // latency: base and status_code
	count  []atomic.Pointer[Series]
}

// NewTarget returns a target of f with the base labels, in order.
func NewTarget(f *Family, base ...attribute.KeyValue) *Target {
	return NewTargets(base, f)[0]
}

// NewTargets returns a target of each of fams with the same base labels,
// in order. They share their attribute sets and their bound on response
// label combinations.
func NewTargets(base []attribute.KeyValue, fams ...*Family) []*Target {
	// attribute.NewSet sorts the slice it is given in place, and callers
	// share their label slices between targets: every set is built from a
	// copy.
	set := attribute.NewSet(slices.Clone(base)...)
	return newTargets(&baseLabels{set: set, key: set.Equivalent()}, fams)
}

// NewTargetsWith is [NewTargets] for the base labels own and then
// shared, of which the targets keep shared as it is instead of copying
// it into a set with own: shared is typically the labels of an endpoint
// that its balancer holds anyway, for each of thousands of names. shared
// must not change afterwards. A key in both is shared's.
func NewTargetsWith(own, shared []attribute.KeyValue, fams ...*Family) []*Target {
	if len(shared) == 0 {
		return NewTargets(own, fams...)
	}
	b := &baseLabels{set: attribute.NewSet(slices.Clone(own)...), shared: shared}
	// The set of all of them is built once here for its key, and dropped.
	all := b.attrs()
	b.key = all.Equivalent()
	return newTargets(b, fams)
}

func newTargets(b *baseLabels, fams []*Family) []*Target {
	ls := &labelSets{base: b, n: len(fams)}
	ts := make([]*Target, len(fams))
	for i, f := range fams {
		ts[i] = &Target{fam: f, labels: ls, idx: i, requests: f.requests.baseSeries(b)}
	}
	return ts
}

// AddOptions returns the option set of the target's base labels and
// then kvs, for counters beside the family.
func (t *Target) AddOptions(kvs ...attribute.KeyValue) []metric.AddOption {
	b := t.labels.base
	if len(kvs) == 0 {
		return []metric.AddOption{metric.WithAttributeSet(b.attrs())}
	}
	return Opts(append(b.appendTo(make([]attribute.KeyValue, 0, b.len()+len(kvs))), kvs...)...)
}

// Request counts one request.
func (t *Target) Request(context.Context) { t.requests.Add() }

// Response counts one response and, for a family with latency, records
// the time since start in whole milliseconds, rounded down, as Linkerd's
// proxy records it (linkerd/metrics latency.rs, From<Ms> for u64): a
// response of 10.4 ms is 10 in _sum and in the le="10" bucket.
func (t *Target) Response(ctx context.Context, r Response, start time.Time) {
	rs := t.labels.sets(r)
	c := rs.count[t.idx].Load()
	if c == nil {
		// Equal sets give the same series: a race makes it once.
		c = t.fam.responses.responseSeries(t.labels.base, rs.r)
		rs.count[t.idx].Store(c)
	}
	c.Add()
	if t.fam.latency != nil {
		t.fam.latency.Record(ctx, wholeMillis(time.Since(start)), rs.record...)
	}
}

// sets returns the sets of r, or of the overflow past maxResponseSeries
// combinations.
func (ls *labelSets) sets(r Response) *responseSets {
	ls.mu.RLock()
	rs := ls.lookupLocked(r)
	ls.mu.RUnlock()
	if rs != nil {
		return rs
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if rs = ls.lookupLocked(r); rs != nil {
		return rs
	}
	if len(ls.few)+len(ls.more) >= maxResponseSeries {
		r = overflow
		if rs = ls.lookupLocked(r); rs != nil {
			return rs
		}
	}
	// The set of the response count is made when a reader collects
	// (see [Sum.responseSeries]); the latency's is kept, for the SDK's
	// histogram takes it with each measurement.
	withStatus, _ := responseKVs(ls.base, r)
	rs = &responseSets{
		r:      r,
		record: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(withStatus...))},
		count:  make([]atomic.Pointer[Series], ls.n),
	}
	if len(ls.few) < fewResponses {
		ls.few = append(ls.few, rs)
		return rs
	}
	if ls.more == nil {
		ls.more = make(map[Response]*responseSets, 1)
	}
	ls.more[r] = rs
	return rs
}

// lookupLocked returns the sets of r, nil when there are none yet.
func (ls *labelSets) lookupLocked(r Response) *responseSets {
	for _, rs := range ls.few {
		if rs.r == r {
			return rs
		}
	}
	return ls.more[r]
}

// responseKVs returns the labels of a response's latency (base and
// status_code) and of its count (those, classification, grpc_status and
// error).
func responseKVs(base *baseLabels, r Response) (withStatus, all []attribute.KeyValue) {
	// One slice for both, as a collection builds the count's labels for
	// every response series it reports: withStatus is its start.
	all = base.appendTo(make([]attribute.KeyValue, 0, base.len()+4))
	if kv, ok := statusKV(r.Status); ok {
		all = append(all, kv)
	}
	withStatus = all[:len(all):len(all)]
	grpc := ""
	if r.GRPC >= 0 {
		grpc = strconv.Itoa(int(r.GRPC))
	}
	class := "success"
	if r.Failure {
		class = "failure"
	}
	all = append(all,
		attribute.String("classification", class),
		attribute.String("grpc_status", grpc),
		attribute.String("error", r.Err))
	return withStatus, all
}

func statusAttr(code int) []attribute.KeyValue {
	if kv, ok := statusKV(code); ok {
		return []attribute.KeyValue{kv}
	}
	return nil
}

// statusKV is the status_code label of code, when it is a status.
func statusKV(code int) (attribute.KeyValue, bool) {
	if code < 100 || code > 599 {
		return attribute.KeyValue{}, false
	}
	return attribute.String("status_code", strconv.Itoa(code)), true
}

// Counter is a counter with prebuilt option sets, for families outside the
// request/response shape (route_retryable_total).
type Counter struct {
	c metric.Int64Counter
}

// NewCounter creates a counter; errors go to otel.Handle.
func NewCounter(meter metric.Meter, name, help string) *Counter {
	c, err := meter.Int64Counter(name, metric.WithDescription(help))
	if err != nil {
		otel.Handle(err)
	}
	return &Counter{c: c}
}

// Opts builds the option set of one series.
func Opts(kvs ...attribute.KeyValue) []metric.AddOption {
	return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(kvs...))}
}

// Add counts one event on the series opts.
func (c *Counter) Add(ctx context.Context, opts []metric.AddOption) { c.c.Add(ctx, 1, opts...) }

// Meter returns the meter inmesh records with from mp (nil: the global
// provider), named after the package's import path.
func Meter(mp metric.MeterProvider, scope string) metric.Meter {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	return mp.Meter(scope, metric.WithInstrumentationVersion(Version))
}

// Version is inmesh's instrumentation version.
const Version = "0.1.0"

// wholeMillis is d in whole milliseconds, rounded down, as Linkerd's proxy
// records a latency (linkerd/metrics/src/latency.rs: seconds·1000 plus the
// sub-second nanoseconds / 1,000,000).
func wholeMillis(d time.Duration) float64 { return float64(d.Milliseconds()) }
