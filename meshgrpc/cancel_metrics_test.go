package meshgrpc_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"
)

// A call the application cancels is no failure of the endpoint or of its
// route. It has the responses Linkerd's proxy records for a request its
// client gave up (linkerd/http/metrics src/requests/service.rs, the
// middleware of response_total and of the route_* series): none when it
// was given up before its response began (the response future dropped
// records nothing), and the response as its stream ended when it was
// given up after its response headers (the body dropped: classify.rs
// classifies a gRPC response without grpc-status at its end as
// Ok(Unknown), a success labelled grpc_status="2"), never
// grpc_status="1", a failure. The first call on
// a new channel waits for the ServiceProfile, whose route takes EmptyCall.
func TestCancelledCallResponseMetrics(t *testing.T) {
	legacy := []string{`direction="outbound"`, `authority="` + books + `"`}
	route := []string{`direction="outbound"`, `rt_route="EmptyCall"`}

	t.Run("unary, before any answer", func(t *testing.T) {
		a := &headedApp{headers: true, arrived: make(chan struct{}, 1)}
		c, m := retryableEmptyCall(t, &app{addr: serveTestService(t, a)}, "")
		ctx, cancel := context.WithCancel(callCtx(t))
		errc := make(chan error, 1)
		go func() {
			_, err := c.EmptyCall(ctx, &testgrpc.Empty{})
			errc <- err
		}()
		<-a.arrived
		cancel()
		require.Equal(t, codes.Canceled, status.Code(<-errc))

		assert.Equal(t, "1", m.Value(t, "request_total", legacy...))
		assert.Empty(t, m.Lines(t, "response_total", legacy...), "a response nobody received")
		assert.Empty(t, m.Lines(t, "response_latency_ms_count", legacy...))
		assert.Equal(t, "1", m.Value(t, "route_request_total", route...))
		assert.Empty(t, m.Lines(t, "route_response_total", route...), "a response nobody received")
		assert.Empty(t, m.Lines(t, "route_actual_response_total", route...))
		assert.Empty(t, m.Lines(t, "route_response_latency_ms_count", route...))
	})

	t.Run("stream, after its response headers", func(t *testing.T) {
		a := &headedApp{headers: true, arrived: make(chan struct{}, 1)}
		c, m := retryableEmptyCall(t, &app{addr: serveTestService(t, a)}, "")
		ctx, cancel := context.WithCancel(callCtx(t))
		s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{})
		require.NoError(t, err)
		md, err := s.Header()
		require.NoError(t, err)
		require.Equal(t, []string{"yes"}, md.Get("paced"), "the response headers")
		<-a.arrived
		cancel()
		_, err = s.Recv()
		require.Equal(t, codes.Canceled, status.Code(err))

		assert.Equal(t, "1", m.Value(t, "request_total", legacy...))
		lines := m.Lines(t, "response_total", legacy...)
		require.Len(t, lines, 1, "%v", lines)
		for _, l := range []string{`classification="success"`, `grpc_status="2"`, `error=""`} {
			assert.Contains(t, lines[0], l)
		}
		assert.Equal(t, "1", m.Value(t, "response_latency_ms_count", legacy...))
	})
}
