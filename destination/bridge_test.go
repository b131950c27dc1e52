package destination_test

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"

	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// viaWatches, set by INMESH_TEST_WATCHES=1, makes serveHeld serve the
// Watches service too, bridged to the test's Destination server, so that
// the tests on scripted servers run over the client's Watches path:
//
//	INMESH_TEST_WATCHES=1 go test ./destination
var viaWatches = os.Getenv("INMESH_TEST_WATCHES") == "1"

// watchesBridge serves Watches by running the Destination server's
// handler for each subscription, on a stream that tags its messages.
type watchesBridge struct {
	watchespb.UnimplementedWatchesServer
	svc pb.DestinationServer
}

func (b watchesBridge) Watch(stream watchespb.Watches_WatchServer) error {
	if err := stream.SendHeader(metadata.MD{}); err != nil {
		return err
	}
	var (
		mu      sync.Mutex // orders Send
		wg      sync.WaitGroup
		cancels = map[uint64]context.CancelFunc{}
	)
	send := func(r *watchespb.WatchResponse) error {
		mu.Lock()
		defer mu.Unlock()
		return stream.Send(r)
	}
	defer func() {
		mu.Lock()
		for _, c := range cancels {
			c()
		}
		mu.Unlock()
		wg.Wait()
	}()
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		if u := req.GetUnsubscribe(); u != nil {
			mu.Lock()
			if c := cancels[u.GetId()]; c != nil {
				c()
				delete(cancels, u.GetId())
			}
			mu.Unlock()
			continue
		}
		sub := req.GetSubscribe()
		ctx, cancel := context.WithCancel(stream.Context())
		mu.Lock()
		cancels[sub.GetId()] = cancel
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			id := sub.GetId()
			var err error
			switch sub.GetKind() {
			case watchespb.Kind_PROFILE:
				err = b.svc.GetProfile(sub.GetDestination(), &tagged[pb.DestinationProfile]{ServerStream: stream, ctx: ctx, send: func(m *pb.DestinationProfile) error {
					return send(&watchespb.WatchResponse{Id: id, Answer: &watchespb.WatchResponse_Profile{Profile: m}})
				}})
			case watchespb.Kind_ENDPOINTS:
				err = b.svc.Get(sub.GetDestination(), &tagged[pb.Update]{ServerStream: stream, ctx: ctx, send: func(m *pb.Update) error {
					return send(&watchespb.WatchResponse{Id: id, Answer: &watchespb.WatchResponse_Update{Update: m}})
				}})
			default:
				err = status.Error(codes.Unimplemented, "kind not bridged")
			}
			if ctx.Err() != nil {
				return
			}
			st := status.Convert(err)
			if err == nil {
				st = status.New(codes.Unavailable, "stream ended") // as an ended Linkerd stream
			}
			_ = send(&watchespb.WatchResponse{Id: id, Answer: &watchespb.WatchResponse_Ended{Ended: &watchespb.Ended{Code: uint32(st.Code()), Message: st.Message()}}})
		}()
	}
}

// tagged is one subscription seen as a Linkerd server stream.
type tagged[T any] struct {
	grpc.ServerStream
	ctx  context.Context
	send func(*T) error
}

func (t *tagged[T]) Context() context.Context { return t.ctx }
func (t *tagged[T]) Send(m *T) error          { return t.send(m) }

// The package's tests pass over the client's Watches path as over
// Linkerd's per-name streams: the test binary runs again with every
// scripted Destination server also serving Watches through watchesBridge
// (kinds the bridge does not carry answer Unimplemented, and those
// watches fall back as against a Linkerd control plane).
func TestSuiteOverWatches(t *testing.T) {
	if viaWatches {
		t.Skip("this is the run over Watches")
	}
	if testing.Short() {
		t.Skip("runs the package's tests again")
	}
	cmd := exec.Command(os.Args[0], "-test.count=1", "-test.skip=^TestSuiteOverWatches$")
	cmd.Env = append(os.Environ(), "INMESH_TEST_WATCHES=1")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "the tests over Watches:\n%s", out)
}
