package metrics

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"weak"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// collect returns the int64 sum named name: its points by their
// attribute sets, and whether it is monotonic and cumulative.
func collect(t *testing.T, r *sdkmetric.ManualReader, name string) (map[attribute.Distinct]int64, metricdata.Sum[int64]) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			require.True(t, ok, "%s is %T, not an int64 sum", name, m.Data)
			points := map[attribute.Distinct]int64{}
			for _, p := range sum.DataPoints {
				points[p.Attributes.Equivalent()] = p.Value
			}
			return points, sum
		}
	}
	return nil, metricdata.Sum[int64]{}
}

// readMeter is a meter of the SDK whose points r collects.
func readMeter(t *testing.T) (*sdkmetric.ManualReader, metric.Meter) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return r, mp.Meter("test")
}

func TestFamilyCountsReachTheReader(t *testing.T) {
	r, meter := readMeter(t)
	base := []attribute.KeyValue{attribute.String("direction", "inbound"), attribute.String("authority", "books:7000")}
	target := NewTarget(NewFamily(meter, "", true), base...)

	points, _ := collect(t, r, "request_total")
	assert.Empty(t, points, "no series before anything is counted")

	for range 3 {
		target.Request(context.Background())
	}
	target.Response(context.Background(), Response{Status: 200, GRPC: -1}, time.Now())
	target.Response(context.Background(), Response{Status: 200, GRPC: -1}, time.Now())
	target.Response(context.Background(), Response{Status: 503, Failure: true, GRPC: -1}, time.Now())

	points, sum := collect(t, r, "request_total")
	assert.True(t, sum.IsMonotonic)
	assert.Equal(t, metricdata.CumulativeTemporality, sum.Temporality)
	assert.Equal(t, map[attribute.Distinct]int64{key(base...): 3}, points)

	ok := attribute.NewSet(append(base[:2:2], attribute.String("status_code", "200"), attribute.String("classification", "success"),
		attribute.String("grpc_status", ""), attribute.String("error", ""))...)
	failed := attribute.NewSet(append(base[:2:2], attribute.String("status_code", "503"), attribute.String("classification", "failure"),
		attribute.String("grpc_status", ""), attribute.String("error", ""))...)
	points, _ = collect(t, r, "response_total")
	assert.Equal(t, map[attribute.Distinct]int64{ok.Equivalent(): 2, failed.Equivalent(): 1}, points)

	// Cumulative: a second collection still reports the totals.
	target.Request(context.Background())
	points, _ = collect(t, r, "request_total")
	assert.Equal(t, int64(4), points[key(base...)])
}

func TestFamiliesOfOneMeterShareSeries(t *testing.T) {
	r, meter := readMeter(t)
	label := attribute.String("direction", "outbound")
	// Two stacks, or a target rebuilt by a profile update: the same
	// labels are one series, counted once each time.
	a := NewTarget(NewFamily(meter, "route_", false), label)
	b := NewTarget(NewFamily(meter, "route_", false), label)
	other := NewTarget(NewFamily(meter, "route_", false), attribute.String("direction", "inbound"))

	var wg sync.WaitGroup
	for _, tg := range []*Target{a, b, other} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1000 {
				tg.Request(context.Background())
			}
		}()
	}
	wg.Wait()
	points, _ := collect(t, r, "route_request_total")
	assert.Equal(t, map[attribute.Distinct]int64{
		key(label): 2000,
		key(attribute.String("direction", "inbound")): 1000,
	}, points)
}

func TestSumsOfTwoProvidersAreApart(t *testing.T) {
	r1, r2 := sdkmetric.NewManualReader(), sdkmetric.NewManualReader()
	mp1 := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r1))
	mp2 := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r2))
	defer mp1.Shutdown(context.Background())
	defer mp2.Shutdown(context.Background())
	label := attribute.String("direction", "inbound")
	NewTarget(NewFamily(mp1.Meter("test"), "", false), label).Request(context.Background())
	t2 := NewTarget(NewFamily(mp2.Meter("test"), "", false), label)
	t2.Request(context.Background())
	t2.Request(context.Background())

	p1, _ := collect(t, r1, "request_total")
	p2, _ := collect(t, r2, "request_total")
	assert.Equal(t, int64(1), p1[key(label)])
	assert.Equal(t, int64(2), p2[key(label)])
}

func key(kvs ...attribute.KeyValue) attribute.Distinct {
	set := attribute.NewSet(kvs...)
	return set.Equivalent()
}

// Past MaxSeries label sets a Sum counts into the overflow series, as the
// SDK does past its default cardinality limit: a flood of label values
// cannot grow it without bound.
func TestSumIsBounded(t *testing.T) {
	r := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r), sdkmetric.WithCardinalityLimit(10*MaxSeries))
	defer mp.Shutdown(context.Background())
	sum := NewSum(mp.Meter("test"), "bounded_total", "")
	for i := range 3 * MaxSeries {
		sum.Series(attribute.NewSet(attribute.Int("i", i))).Add()
	}
	points, _ := collect(t, r, "bounded_total")
	assert.Len(t, points, MaxSeries)
	assert.Equal(t, int64(1), points[key(attribute.Int("i", 0))])
	assert.Equal(t, int64(2*MaxSeries+1), points[key(attribute.Bool("otel.metric.overflow", true))])
	assert.Len(t, sum.list, MaxSeries)
}

// liveSums counts the Sums the process-wide map still reaches.
func liveSums() int {
	n := 0
	sums.Range(func(_, v any) bool {
		if ref, ok := v.(weak.Pointer[Sum]); !ok || ref.Value() != nil {
			n++
		}
		return true
	})
	return n
}

// TestShutDownProvidersAreReleased: a MeterProvider that was used, shut
// down and dropped is not kept alive by the Sums made on it, however many
// come and go (each used to stay reachable for the life of the process,
// about 169 KiB apiece).
func TestShutDownProvidersAreReleased(t *testing.T) {
	runtime.GC()
	before := liveSums()
	var collected atomic.Int64
	const providers = 50
	func() {
		for range providers {
			r := sdkmetric.NewManualReader()
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(r))
			runtime.AddCleanup(mp, func(*atomic.Int64) { collected.Add(1) }, &collected)
			target := NewTarget(NewFamily(mp.Meter("test"), "", false), attribute.String("direction", "inbound"))
			target.Request(context.Background())
			points, _ := collect(t, r, "request_total")
			require.Len(t, points, 1)
			require.NoError(t, mp.Shutdown(context.Background()))
		}
	}()
	assert.Greater(t, liveSums(), before, "the Sums exist while they may be reachable")
	require.Eventually(t, func() bool {
		runtime.GC()
		return collected.Load() == providers && liveSums() == before
	}, 30*time.Second, 10*time.Millisecond, "%d of %d providers collected, %d Sums live (%d before)",
		collected.Load(), providers, liveSums(), before)
}

// Targets made together (a route's series and its actual attempts') share
// their attribute sets, and still count apart: each family exports its
// own points, with the same labels, and a target that saw nothing exports
// none.
func TestTargetsMadeTogetherShareSets(t *testing.T) {
	r, meter := readMeter(t)
	base := []attribute.KeyValue{attribute.String("direction", "outbound"), attribute.String("dst", "books:7000")}
	ts := NewTargets(base, NewFamily(meter, "route_", true), NewFamily(meter, "route_actual_", true), NewFamily(meter, "idle_", true))
	route, actual := ts[0], ts[1]
	ok, failed := Response{Status: 200, GRPC: -1}, Response{Status: 503, Failure: true, GRPC: -1}
	route.Request(context.Background())
	route.Response(context.Background(), failed, time.Now())
	for range 2 {
		actual.Request(context.Background())
	}
	actual.Response(context.Background(), failed, time.Now())
	actual.Response(context.Background(), ok, time.Now())

	assert.Same(t, route.labels, actual.labels)
	rs := route.labels.sets(failed)
	assert.Same(t, rs, actual.labels.sets(failed), "one response's sets for both")
	assert.NotSame(t, rs.count[0].Load(), rs.count[1].Load(), "series of their own")
	assert.Nil(t, route.labels.sets(ok).count[0].Load(), "no series for a response the route did not see")
	assert.Nil(t, rs.count[2].Load())

	want := func(resp Response, class string) attribute.Distinct {
		s := attribute.NewSet(append(slices.Clone(base), attribute.String("status_code", strconv.Itoa(resp.Status)),
			attribute.String("classification", class), attribute.String("grpc_status", ""), attribute.String("error", ""))...)
		return s.Equivalent()
	}
	baseSet := attribute.NewSet(base...)
	points, _ := collect(t, r, "route_request_total")
	assert.Equal(t, map[attribute.Distinct]int64{baseSet.Equivalent(): 1}, points)
	points, _ = collect(t, r, "route_actual_request_total")
	assert.Equal(t, map[attribute.Distinct]int64{baseSet.Equivalent(): 2}, points)
	points, _ = collect(t, r, "route_response_total")
	assert.Equal(t, map[attribute.Distinct]int64{want(failed, "failure"): 1}, points)
	points, _ = collect(t, r, "route_actual_response_total")
	assert.Equal(t, map[attribute.Distinct]int64{want(failed, "failure"): 1, want(ok, "success"): 1}, points)
	points, _ = collect(t, r, "idle_request_total")
	assert.Empty(t, points)
	points, _ = collect(t, r, "idle_response_total")
	assert.Empty(t, points)

	// Options beside the family: the base labels, and more.
	assert.Equal(t, []metric.AddOption{metric.WithAttributeSet(baseSet)}, route.AddOptions())
	assert.Equal(t, []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(append(slices.Clone(base), attribute.String("skipped", "no_budget"))...))},
		route.AddOptions(attribute.String("skipped", "no_budget")))
}

// A response count's set is built when a reader collects: two targets of
// the same labels, and responses that label alike (no status line, any
// negative gRPC code), still count into one series, reported with the
// same labels at each collection.
func TestResponseSeriesLabelledAlikeAreOne(t *testing.T) {
	r, meter := readMeter(t)
	base := []attribute.KeyValue{attribute.String("direction", "outbound"), attribute.String("authority", "books:7000")}
	a := NewTarget(NewFamily(meter, "", false), base...)
	b := NewTarget(NewFamily(meter, "", false), base...)
	a.Response(context.Background(), Response{Status: 0, Failure: true, GRPC: -1, Err: "timeout"}, time.Now())
	b.Response(context.Background(), Response{Status: 600, Failure: true, GRPC: -2, Err: "timeout"}, time.Now())
	b.Response(context.Background(), Response{Status: 200, GRPC: 0}, time.Now())

	timeout := attribute.NewSet(append(slices.Clone(base), attribute.String("classification", "failure"),
		attribute.String("grpc_status", ""), attribute.String("error", "timeout"))...)
	ok := attribute.NewSet(append(slices.Clone(base), attribute.String("status_code", "200"), attribute.String("classification", "success"),
		attribute.String("grpc_status", "0"), attribute.String("error", ""))...)
	want := map[attribute.Distinct]int64{timeout.Equivalent(): 2, ok.Equivalent(): 1}
	for range 2 {
		points, sum := collect(t, r, "response_total")
		assert.Equal(t, want, points)
		assert.Len(t, sum.DataPoints, 2)
	}
}
