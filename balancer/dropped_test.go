package balancer

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/classify"
)

// dropBackend starts an endpoint that begins a response and holds it
// open until its client goes away. A gRPC call goes to a real grpc-go
// server, which sends one empty message and no status; any other request
// (or one with x-plain) gets the status of its x-status header (200) and
// one byte. With x-status and no x-hold the response ends at once.
func dropBackend(t *testing.T) endpoint.Endpoint {
	srv := grpc.NewServer(grpc.UnknownServiceHandler(func(_ any, s grpc.ServerStream) error {
		if err := s.SendMsg(&emptypb.Empty{}); err != nil {
			return err
		}
		<-s.Context().Done()
		return s.Context().Err()
	}))
	t.Cleanup(srv.Stop)
	return backendHandler(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Plain") == "" && classify.IsGRPC(r.Header) {
			srv.ServeHTTP(w, r)
			return
		}
		code := http.StatusOK
		if v := r.Header.Get("X-Status"); v != "" {
			code, _ = strconv.Atoi(v)
		}
		w.WriteHeader(code)
		w.Write([]byte{0})
		if r.Header.Get("X-Hold") == "" {
			return
		}
		http.NewResponseController(w).Flush()
		<-r.Context().Done()
	}))
}

// A response whose body its caller drops before the end (closes it, or
// cancels its request and reads on) gives failure accrual the verdict
// Linkerd's breaker gets: the class of the stream as it stood, without
// trailers (linkerd2-proxy linkerd/http/classify/src/channel.rs, whose
// ResponseBody sends eos(None) when dropped; its test broadcasts is the
// first row). As linkerd/app/core/src/classify.rs ends each of its Eos
// states without trailers: a head with a final class keeps it (Class), a
// gRPC call without status in its head is a success (GrpcOpen: UNKNOWN,
// not a failure code), and under route classes none of which matched,
// the HTTP class of its status stands (ProfileUnmatched). The dropped
// request is the probe of an endpoint on probation: a success restores
// it, a failure trips it again; before, the probe was given back with no
// verdict and the endpoint stayed on probation.
func TestDroppedBodyIsClassifiedAsLinkerd(t *testing.T) {
	unmatched := &classify.Classifier{Classes: []classify.ResponseClass{{Match: statusIs(404), Failure: true}}}
	rows := []struct {
		name   string
		grpc   bool // the request is a gRPC call
		plain  bool // a gRPC call the plain handler answers
		status int  // of the plain handler; 0: 200
		route  *classify.Classifier
		want   string
	}{
		{name: "broadcasts: plain HTTP 200", want: stateReady},
		{name: "plain HTTP 500 (Class)", status: 500, want: stateTripped},
		{name: "gRPC before its status (GrpcOpen)", grpc: true, want: stateReady},
		{name: "gRPC, route classes unmatched, 200 (ProfileUnmatched)", grpc: true, route: unmatched, want: stateReady},
		{name: "gRPC, route classes unmatched, 500 (ProfileUnmatched)", grpc: true, plain: true, status: 500, route: unmatched,
			want: stateTripped},
	}
	ep := dropBackend(t)
	for _, tc := range rows {
		for _, cancelled := range []bool{false, true} {
			name := tc.name + ", body closed"
			if cancelled {
				name = tc.name + ", request cancelled"
			}
			t.Run(name, func(t *testing.T) {
				clock := &fakeClock{}
				clock.now.Store(1)
				bal, client := newClient(t, staticSource(t, map[string][]endpoint.Endpoint{svc: {ep}}), withClock(clock.read),
					WithFailureAccrual(&FailureAccrual{ConsecutiveFailures: &ConsecutiveFailures{MaxFailures: 1,
						Backoff: Backoff{MinBackoff: time.Second, MaxBackoff: time.Hour, JitterRatio: -1}}}))

				req, err := http.NewRequest(http.MethodGet, svcURL, nil)
				require.NoError(t, err)
				req.Header.Set("X-Status", "500")
				resp, err := client.Do(req)
				require.NoError(t, err)
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				require.Equal(t, stateTripped, stateOf(bal, svc, ep).State)
				clock.now.Add(int64(time.Second))
				require.Equal(t, stateProbation, stateOf(bal, svc, ep).State)

				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				if tc.route != nil {
					ctx = classify.WithProvider(ctx, routeClassifier{tc.route})
				}
				if tc.grpc {
					req, err = http.NewRequestWithContext(ctx, http.MethodPost, svcURL+"test.Drop/Stream", bytes.NewReader([]byte{0, 0, 0, 0, 0}))
					require.NoError(t, err)
					req.Header.Set("Content-Type", "application/grpc")
					req.Header.Set("Te", "trailers")
				} else {
					req, err = http.NewRequestWithContext(ctx, http.MethodGet, svcURL, nil)
					require.NoError(t, err)
				}
				req.Header.Set("X-Hold", "1")
				if tc.plain {
					req.Header.Set("X-Plain", "1")
				}
				if tc.status != 0 {
					req.Header.Set("X-Status", strconv.Itoa(tc.status))
				}
				resp, err = client.Do(req)
				require.NoError(t, err)
				first := make([]byte, 1) // the gRPC message's first byte, or the plain one
				_, err = io.ReadFull(resp.Body, first)
				require.NoError(t, err)
				if cancelled {
					cancel()
					_, err = io.Copy(io.Discard, resp.Body)
					assert.Error(t, err, "the body breaks off")
				}
				resp.Body.Close()
				if tc.grpc {
					assert.Empty(t, resp.Header.Get("Grpc-Status"), "no status in the head")
					assert.Empty(t, resp.Trailer.Get("Grpc-Status"), "no status came")
				}
				assert.Equal(t, tc.want, stateOf(bal, svc, ep).State, "the endpoint after its probe was dropped")
			})
		}
	}
}
