package metrics

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestResponseSeriesAreBounded(t *testing.T) {
	target := NewTarget(NewFamily(noop.NewMeterProvider().Meter("x"), "", true), attribute.String("direction", "inbound"))
	for i := range 2000 {
		target.Response(context.Background(), Response{Status: 100 + i%500, GRPC: int32(i % 17), Err: fmt.Sprint(i)}, time.Now())
	}
	assert.LessOrEqual(t, len(target.labels.few)+len(target.labels.more), maxResponseSeries+1)
	assert.NotNil(t, target.labels.lookupLocked(overflow))
}

func TestStatusLabelOnlyForValidCodes(t *testing.T) {
	assert.Nil(t, statusAttr(0))
	assert.Nil(t, statusAttr(600))
	assert.Equal(t, "204", statusAttr(204)[0].Value.AsString())
}

// Targets may share their caller's label slice, unsorted: recording on
// them at once, with or without a status label, neither races (building an
// attribute set sorts the slice it is given) nor changes the caller's
// slice.
func TestTargetsSharingLabels(t *testing.T) {
	f := NewFamily(noop.NewMeterProvider().Meter("x"), "", true)
	shared := []attribute.KeyValue{attribute.String("z", "1"), attribute.String("a", "2"), attribute.String("m", "3")}
	want := append([]attribute.KeyValue(nil), shared...)
	done := make(chan struct{})
	for i := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			target := NewTarget(f, shared...)
			for j := range 50 {
				target.Response(context.Background(), Response{Status: (i + j) % 2 * 200}, time.Now())
			}
		}()
	}
	for range 4 {
		<-done
	}
	assert.Equal(t, want, shared)
}

// response_latency_ms holds whole milliseconds, rounded down, as Linkerd's
// proxy records them (linkerd/metrics latency.rs: as_secs*1000 +
// subsec_nanos/1_000_000): a response of 10.4 ms is 10 in _sum and falls
// in le="10", where a fractional 10.4 would fall in le="20". The route_
// families record through the same Target.
func TestLatencyInWholeMilliseconds(t *testing.T) {
	// The conversion, as Linkerd's From<Ms> for u64.
	for _, tc := range []struct {
		elapsed time.Duration
		want    float64
	}{
		{10400 * time.Microsecond, 10},
		{1300 * time.Microsecond, 1},
		{999 * time.Microsecond, 0},
		{600 * time.Microsecond, 0},
		{2*time.Second + 400*time.Microsecond, 2000},
		{time.Minute + 999999*time.Nanosecond, 60000},
	} {
		assert.Equal(t, tc.want, wholeMillis(tc.elapsed), "%v", tc.elapsed)
	}

	// A response recorded through a Target: its sample is a whole number
	// of milliseconds, at least the whole ones that passed, counted under
	// the bucket of that number.
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	target := NewTarget(NewFamily(mp.Meter("x"), "", true), attribute.String("direction", "inbound"))
	target.Response(context.Background(), Response{Status: 200, GRPC: -1}, time.Now().Add(-10400*time.Microsecond))
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	var dp *metricdata.HistogramDataPoint[float64]
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if h, ok := m.Data.(metricdata.Histogram[float64]); ok && m.Name == "response_latency_ms" {
				require.Len(t, h.DataPoints, 1)
				dp = &h.DataPoints[0]
			}
		}
	}
	require.NotNil(t, dp, "no response_latency_ms")
	assert.Equal(t, math.Trunc(dp.Sum), dp.Sum, "_sum is whole milliseconds")
	assert.GreaterOrEqual(t, dp.Sum, 10.0, "_sum")
	i := slices.IndexFunc(dp.Bounds, func(b float64) bool { return dp.Sum <= b })
	require.GreaterOrEqual(t, i, 0)
	assert.Equal(t, uint64(1), dp.BucketCounts[i], "counted under le=%v (bounds %v, counts %v)", dp.Bounds[i], dp.Bounds, dp.BucketCounts)
}
