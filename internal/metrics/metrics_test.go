package metrics

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestResponseSeriesAreBounded(t *testing.T) {
	target := NewTarget(NewFamily(noop.NewMeterProvider().Meter("x"), "", true), attribute.String("direction", "inbound"))
	for i := range 2000 {
		target.Response(context.Background(), Response{Status: 100 + i%500, GRPC: int32(i % 17), Err: fmt.Sprint(i)}, time.Now())
	}
	assert.LessOrEqual(t, len(target.labels.resp), maxResponseSeries+1)
	assert.NotNil(t, target.labels.resp[overflow])
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
