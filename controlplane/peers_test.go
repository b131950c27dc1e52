package controlplane_test

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/regtest"
	"github.com/inmesh/inmesh/internal/testutil"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/watchespb"
)

// peerTestTimeout bounds each wait of the tests of the bounds per peer.
const peerTestTimeout = 30 * time.Second

const booksAuthority = "books.default.svc.cluster.local:7000"

// dialFrom returns a plaintext connection to addr whose source address is
// the loopback address from (127.0.0.1, 127.0.0.2, ...): another peer, by
// address, for the bounds per peer.
func dialFrom(t *testing.T, addr, from string) *grpc.ClientConn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return d.DialContext(ctx, "tcp", a) }))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return conn
}

// openWatches opens a Watches stream on conn and waits for its headers,
// which the server sends once it took the stream; it returns the stream,
// its cancel, and the error that refused it (nil when open).
func openWatches(t *testing.T, conn *grpc.ClientConn) (watchespb.Watches_WatchClient, context.CancelFunc, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	st, err := watchespb.NewWatchesClient(conn).Watch(ctx)
	require.NoError(t, err)
	// A refused stream is a trailers-only answer: no headers, and Recv
	// returns its status.
	if md, err := st.Header(); err != nil || md == nil {
		_, err := st.Recv()
		require.Error(t, err)
		return nil, cancel, err
	}
	return st, cancel, nil
}

// subscribeProfile subscribes id to books' profile on st and returns the
// first answer to it.
func subscribeProfile(t *testing.T, st watchespb.Watches_WatchClient, id uint64) *watchespb.WatchResponse {
	t.Helper()
	require.NoError(t, st.Send(&watchespb.WatchRequest{Request: &watchespb.WatchRequest_Subscribe{Subscribe: &watchespb.Subscribe{
		Id: id, Kind: watchespb.Kind_PROFILE, Destination: &pb.GetDestination{Path: booksAuthority}}}}))
	return recvWithin(t, st)
}

func recvWithin(t *testing.T, st watchespb.Watches_WatchClient) *watchespb.WatchResponse {
	t.Helper()
	type result struct {
		r   *watchespb.WatchResponse
		err error
	}
	ch := make(chan result, 1)
	go func() {
		r, err := st.Recv()
		ch <- result{r, err}
	}()
	select {
	case r := <-ch:
		require.NoError(t, r.err)
		return r.r
	case <-time.After(peerTestTimeout):
		t.Fatal("no answer")
	}
	return nil
}

// The Watches streams of one peer (one IP address) are bounded: past the
// bound a new stream ends with ResourceExhausted naming the peer and is
// counted; another address is not refused; the open streams go on; a
// closed stream gives its room back.
func TestWatchesStreamsPerPeer(t *testing.T) {
	m := testutil.NewMetrics(t)
	c := regtest.Start(t, regtest.Manifests, controlplane.WithMeterProvider(m.Provider),
		controlplane.WithWatchesPerPeer(2, 0), controlplane.WithLogger(slog.New(slog.DiscardHandler)))
	one := dialFrom(t, c.Addr, "127.0.0.1")
	a, cancelA, err := openWatches(t, one)
	require.NoError(t, err)
	b, _, err := openWatches(t, one)
	require.NoError(t, err)

	_, _, err = openWatches(t, one)
	require.Error(t, err, "a third stream of 127.0.0.1")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "address 127.0.0.1 has 2 Watches streams open")
	assert.Equal(t, "1", m.Value(t, "stream_refused_total", `reason="peer_watches"`))

	// Another address has its own room.
	other, _, err := openWatches(t, dialFrom(t, c.Addr, "127.0.0.2"))
	require.NoError(t, err, "127.0.0.2 is another peer")
	assert.NotNil(t, subscribeProfile(t, other, 1).GetProfile())

	// The open streams are unaffected.
	assert.NotNil(t, subscribeProfile(t, a, 1).GetProfile())
	assert.NotNil(t, subscribeProfile(t, b, 1).GetProfile())

	// Closing one gives its room back, once the server saw it end.
	cancelA()
	require.Eventually(t, func() bool {
		_, cancel, err := openWatches(t, one)
		if err != nil {
			cancel()
		}
		return err == nil
	}, peerTestTimeout, 10*time.Millisecond)
}

// The subscriptions of one peer are bounded over all its Watches
// streams: past the bound a subscription ends (Ended, ResourceExhausted)
// and is counted, while the stream and its open subscriptions go on;
// another peer is not refused; an unsubscription gives its room back.
func TestWatchesSubscriptionsPerPeer(t *testing.T) {
	m := testutil.NewMetrics(t)
	c := regtest.Start(t, regtest.Manifests, controlplane.WithMeterProvider(m.Provider),
		controlplane.WithWatchesPerPeer(0, 3), controlplane.WithLogger(slog.New(slog.DiscardHandler)))
	one := dialFrom(t, c.Addr, "127.0.0.1")
	a, _, err := openWatches(t, one)
	require.NoError(t, err)
	b, _, err := openWatches(t, one)
	require.NoError(t, err)
	require.NotNil(t, subscribeProfile(t, a, 1).GetProfile())
	require.NotNil(t, subscribeProfile(t, a, 2).GetProfile())
	require.NotNil(t, subscribeProfile(t, b, 1).GetProfile())

	r := subscribeProfile(t, b, 2)
	require.NotNil(t, r.GetEnded(), "a fourth subscription of 127.0.0.1: %v", r)
	assert.Equal(t, uint64(2), r.GetId())
	assert.Equal(t, uint32(codes.ResourceExhausted), r.GetEnded().GetCode())
	assert.Contains(t, r.GetEnded().GetMessage(), "address 127.0.0.1 has 3 subscriptions open")
	assert.Equal(t, "1", m.Value(t, "stream_refused_total", `reason="peer_subscriptions"`))

	// The stream goes on, still full.
	require.NotNil(t, subscribeProfile(t, b, 3).GetEnded(), "still full")

	// Another address has its own room.
	other, _, err := openWatches(t, dialFrom(t, c.Addr, "127.0.0.2"))
	require.NoError(t, err)
	for id := range uint64(3) {
		assert.NotNil(t, subscribeProfile(t, other, id).GetProfile(), "subscription %d of 127.0.0.2", id)
	}

	// An unsubscription on a gives b room: the server applies a's
	// requests in order, so a subscription sent after it on a is
	// answered after the room is back; then b gets it.
	require.NoError(t, a.Send(&watchespb.WatchRequest{Request: &watchespb.WatchRequest_Unsubscribe{Unsubscribe: &watchespb.Unsubscribe{Id: 1}}}))
	require.NoError(t, a.Send(&watchespb.WatchRequest{Request: &watchespb.WatchRequest_Subscribe{Subscribe: &watchespb.Subscribe{
		Id: 9, Kind: watchespb.Kind(99)}}}))
	require.NotNil(t, recvWithin(t, a).GetEnded(), "the marker after the unsubscription")
	assert.NotNil(t, subscribeProfile(t, b, 4).GetProfile(), "the room a gave back")
}

// Linkerd's per-name streams of one peer are bounded, all kinds together:
// past the bound a new stream ends with ResourceExhausted and is counted;
// another address is not refused; a closed stream gives its room back.
func TestLinkerdStreamsPerPeer(t *testing.T) {
	m := testutil.NewMetrics(t)
	c := regtest.Start(t, regtest.Manifests, controlplane.WithMeterProvider(m.Provider),
		controlplane.WithMaxStreamsPerPeer(2), controlplane.WithLogger(slog.New(slog.DiscardHandler)))
	api := pb.NewDestinationClient(dialFrom(t, c.Addr, "127.0.0.1"))
	profile := func(t *testing.T, api pb.DestinationClient) (context.CancelFunc, error) {
		ctx, cancel := context.WithTimeout(context.Background(), peerTestTimeout)
		t.Cleanup(cancel)
		st, err := api.GetProfile(ctx, &pb.GetDestination{Path: booksAuthority})
		require.NoError(t, err)
		_, err = st.Recv()
		return cancel, err
	}
	cancelFirst, err := profile(t, api)
	require.NoError(t, err)
	_, err = profile(t, api)
	require.NoError(t, err)

	_, err = profile(t, api)
	require.Error(t, err, "a third stream of 127.0.0.1")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), "address 127.0.0.1 has 2 streams open")
	assert.Equal(t, "1", m.Value(t, "stream_refused_total", `reason="peer_streams"`))

	_, err = profile(t, pb.NewDestinationClient(dialFrom(t, c.Addr, "127.0.0.2")))
	require.NoError(t, err, "127.0.0.2 is another peer")

	cancelFirst()
	require.Eventually(t, func() bool {
		cancel, err := profile(t, api)
		if err != nil {
			cancel()
		}
		return err == nil
	}, peerTestTimeout, 10*time.Millisecond)
}

// A peer with a verified mTLS identity is counted by its identity: two
// identities from one address each have their own bound, and one identity
// is refused past it.
func TestWatchesPerPeerByIdentity(t *testing.T) {
	m := testutil.NewMetrics(t)
	c := regtest.Start(t, regtest.Manifests, controlplane.WithMeterProvider(m.Provider),
		controlplane.WithWatchesPerPeer(1, 0), controlplane.WithLogger(slog.New(slog.DiscardHandler)))
	books := c.Dial(t, c.Certify(t, regtest.BooksID))
	web := c.Dial(t, c.Certify(t, regtest.WebID))
	_, _, err := openWatches(t, books)
	require.NoError(t, err)
	_, _, err = openWatches(t, web)
	require.NoError(t, err, "another identity from the same address")

	_, _, err = openWatches(t, c.Dial(t, c.Certify(t, regtest.BooksID)))
	require.Error(t, err, "books again, over another connection")
	assert.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	assert.Contains(t, status.Convert(err).Message(), `identity "`+regtest.BooksID+`"`)
	assert.Equal(t, "1", m.Value(t, "stream_refused_total", `reason="peer_watches"`))
}
