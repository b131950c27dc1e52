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
	assert.LessOrEqual(t, len(target.resp), maxResponseSeries+1)
	assert.NotNil(t, target.resp[overflow])
}

func TestStatusLabelOnlyForValidCodes(t *testing.T) {
	assert.Nil(t, statusAttr(0))
	assert.Nil(t, statusAttr(600))
	assert.Equal(t, "204", statusAttr(204)[0].Value.AsString())
}
