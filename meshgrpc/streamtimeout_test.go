package meshgrpc_test

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testgrpc "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/internal/testutil"
)

// pacedApp streams as its caller asks: StreamingOutputCall sends one
// message per ResponseParameters, after its interval, then holds the
// stream open until the call ends; FullDuplexCall reads every message and
// then answers nothing until the call ends. Each call's end is reported.
type pacedApp struct {
	testgrpc.UnimplementedTestServiceServer
	ended chan error
}

func (a *pacedApp) StreamingOutputCall(req *testgrpc.StreamingOutputCallRequest, s grpc.ServerStreamingServer[testgrpc.StreamingOutputCallResponse]) error {
	for _, p := range req.GetResponseParameters() {
		select {
		case <-time.After(time.Duration(p.GetIntervalUs()) * time.Microsecond):
		case <-s.Context().Done():
			a.ended <- s.Context().Err()
			return s.Context().Err()
		}
		if err := s.Send(&testgrpc.StreamingOutputCallResponse{}); err != nil {
			a.ended <- err
			return err
		}
	}
	<-s.Context().Done()
	a.ended <- s.Context().Err()
	return s.Context().Err()
}

func (a *pacedApp) FullDuplexCall(s grpc.BidiStreamingServer[testgrpc.StreamingOutputCallRequest, testgrpc.StreamingOutputCallResponse]) error {
	for {
		if _, err := s.Recv(); err != nil {
			if !errors.Is(err, io.EOF) {
				a.ended <- err
				return err
			}
			break
		}
	}
	<-s.Context().Done()
	a.ended <- s.Context().Err()
	return s.Context().Err()
}

// timeoutRoute is a GRPCRoute of both streaming methods with annotations.
func timeoutRoute(annotations string) string {
	return `
---
apiVersion: gateway.networking.k8s.io/v1
kind: GRPCRoute
metadata:
  name: streams
  namespace: default
  annotations: ` + annotations + `
spec:
  parentRefs: [{kind: Service, group: core, name: books, port: 7000}]
  rules:
  - matches: [{method: {service: grpc.testing.TestService, method: StreamingOutputCall}}, {method: {service: grpc.testing.TestService, method: FullDuplexCall}}]
    backendRefs: [{name: books, port: 7000}]
`
}

// A route's idle and response timeouts on a stream, as Linkerd's proxy
// enforces them (linkerd/http/stream-timeouts): the idle timeout ends a
// stream in which no message moved for that long, however long the
// stream has lived; the response timeout runs from the end of the
// request, so that a slow upload does not count, to the end of the
// response. Either ends the call DEADLINE_EXCEEDED, cancels it at the
// server, and is counted under Linkerd's error label (and its attempt as
// a timeout).
func TestStreamRouteTimeouts(t *testing.T) {
	waitEnd := func(t *testing.T, a *pacedApp) {
		t.Helper()
		select {
		case <-a.ended:
		case <-time.After(testutil.Timeout):
			t.Fatal("the server never saw the call end")
		}
	}
	t.Run("idle", func(t *testing.T) {
		a := &pacedApp{ended: make(chan error, 4)}
		c, m := policyChannel(t, timeoutRoute(`{timeout.linkerd.io/idle: 1s}`), map[string][]endpoint.Endpoint{books: {{Addr: serveTestService(t, a)}}})
		// Fifteen messages 100 ms apart: the stream outlives the idle
		// timeout, and is never idle for it.
		params := make([]*testgrpc.ResponseParameters, 15)
		for i := range params {
			params[i] = &testgrpc.ResponseParameters{IntervalUs: int32((100 * time.Millisecond).Microseconds())}
		}
		ctx := callCtx(t)
		s, err := c.StreamingOutputCall(ctx, &testgrpc.StreamingOutputCallRequest{ResponseParameters: params})
		require.NoError(t, err)
		for i := range params {
			_, err := s.Recv()
			require.NoError(t, err, "message %d of a stream that moves", i)
		}
		// Then nothing moves.
		_, err = s.Recv()
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		assert.Contains(t, status.Convert(err).Message(), "stream idle for 1s")
		assert.NoError(t, ctx.Err(), "the caller's own deadline did not end it")
		waitEnd(t, a)
		assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="streams"`, `error="IDLE_TIMEOUT"`))
	})
	t.Run("response", func(t *testing.T) {
		a := &pacedApp{ended: make(chan error, 4)}
		const timeout = 300 * time.Millisecond
		c, m := policyChannel(t, timeoutRoute(`{timeout.linkerd.io/response: 300ms}`), map[string][]endpoint.Endpoint{books: {{Addr: serveTestService(t, a)}}})
		ctx := callCtx(t)
		s, err := c.FullDuplexCall(ctx)
		require.NoError(t, err)
		// An upload that takes twice the response timeout is not cut:
		// the timeout starts with the end of the request.
		start := time.Now()
		for time.Since(start) < 2*timeout {
			require.NoError(t, s.Send(&testgrpc.StreamingOutputCallRequest{}), "a message of a slow upload")
			time.Sleep(timeout / 10)
		}
		require.NoError(t, s.CloseSend())
		_, err = s.Recv()
		assert.Equal(t, codes.DeadlineExceeded, status.Code(err), "%v", err)
		assert.Contains(t, status.Convert(err).Message(), "response timed out after 300ms")
		assert.NoError(t, ctx.Err(), "the caller's own deadline did not end it")
		waitEnd(t, a)
		assert.Equal(t, "1", m.Value(t, "outbound_grpc_route_request_statuses_total", `route_name="streams"`, `error="RESPONSE_STREAM_TIMEOUT"`))
		// The attempt, which had no response headers, is a timeout in
		// response_total, not a call its application gave up.
		assert.Equal(t, "1", m.Value(t, "response_total", `direction="outbound"`, `error="timeout"`, `classification="failure"`))
	})
}
