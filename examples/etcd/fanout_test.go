package etcd_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
)

// A change in etcd to one Service's endpoints reaches that Service's Get
// streams and no other: an endpoints key rewritten, a registration added,
// an endpoints key deleted, each while another Service's stream is open.
func TestChangeReachesOnlyItsService(t *testing.T) {
	const books = "books.default.svc.cluster.local:7002"
	set := func(authority string, addrs ...string) string {
		s := "- authority: " + authority + "\n  endpoints:\n"
		for _, a := range addrs {
			s += "  - addr: " + a + "\n"
		}
		return s
	}
	m := etcdtest.Start(t)
	admin := newClient(t, m.Endpoint)
	put(t, admin, etcdstore.EndpointsKey(prefix, "authors"), set(authority, "127.0.0.1:4143"))
	put(t, admin, etcdstore.EndpointsKey(prefix, "books"), set(books, "127.0.0.3:4143"))
	r := startReplica(t, m.Endpoint)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	get := func(authority string) grpc.ServerStreamingClient[pb.Update] {
		st, err := r.dst.Get(ctx, &pb.GetDestination{Path: authority})
		require.NoError(t, err)
		return st
	}
	authors, bookStream := get(authority), get(books)
	assert.Equal(t, []string{"127.0.0.1"}, addrs(recv(t, "authors' first answer", authors.Recv)))
	assert.Equal(t, []string{"127.0.0.3"}, addrs(recv(t, "books' first answer", bookStream.Recv)))

	// Each change is seen on its Service's stream first, so that the
	// load is done when the other stream is checked for silence.
	quiet := func(what string, st grpc.ServerStreamingClient[pb.Update]) <-chan *pb.Update {
		return noMessage(t, what, 300*time.Millisecond, st.Recv)
	}

	put(t, admin, etcdstore.EndpointsKey(prefix, "books"), set(books, "127.0.0.3:4143", "127.0.0.4:4143"))
	assert.Equal(t, []string{"127.0.0.4"}, addrs(recv(t, "books after its key changed", bookStream.Recv)))
	late := quiet("authors while books' key changed", authors)

	reg := etcdstore.RegistrationKey(prefix, books, netip.MustParseAddrPort("127.0.0.5:4143"), 0x10)
	put(t, admin, reg, `{"weight":10000}`)
	assert.Equal(t, []string{"127.0.0.5"}, addrs(recv(t, "books after a registration", bookStream.Recv)))
	select {
	case u := <-late:
		t.Fatalf("authors' stream got %v when books got a registration", u)
	case <-time.After(300 * time.Millisecond):
	}

	_, err := admin.Delete(ctx, etcdstore.EndpointsKey(prefix, "authors"))
	require.NoError(t, err)
	// The receive that noMessage started takes the answer.
	select {
	case u := <-late:
		assert.Empty(t, u.GetAdd().GetAddrs(), "authors' key deleted: %v", u)
	case <-time.After(timeout):
		t.Fatalf("authors after its key was deleted: no message within %v", timeout)
	}
	_ = quiet("books while authors' key was deleted", bookStream)
}
