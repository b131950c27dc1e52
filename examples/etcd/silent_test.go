package etcd_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/controlplane/etcdstore"
	"github.com/inmesh/inmesh/examples/internal/etcdtest"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/inmesh/inmesh/registration"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// A registrant that goes silent (its host gone, its process frozen: no
// FIN, no RST) loses its registration within about twice the TTL: the
// control plane's server, built with KeepaliveOptions(ttl), pings a silent
// connection and closes it when no answer comes, which ends the
// registration and revokes its lease. Without the options it stayed
// registered as long as the replica lived.
func TestSilentRegistrantExpires(t *testing.T) {
	const ttl = time.Second
	m := etcdtest.Start(t)
	cli := newClient(t, m.Endpoint)
	srv := grpc.NewServer(controlplane.KeepaliveOptions(ttl)...)
	cp := controlplane.NewServer(controlplane.NewStore(), controlplane.WithInsecureRegistration(), controlplane.WithLogger(quiet),
		controlplane.WithRegistry(etcdstore.NewRegistry(cli, prefix, ttl)))
	cp.Register(srv)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(lis)
	t.Cleanup(func() { _ = cp.Shutdown(context.Background()); srv.Stop() })
	p := testutil.StartStallProxy(t, lis.Addr().String())

	conn, err := registration.Dial(p.Addr(), nil, "")
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	reg, err := registration.Register(ctx, conn, []registration.Endpoint{{Authority: regBooks, Addr: netip.MustParseAddrPort("127.0.0.9:7000")}},
		registration.WithLogger(quiet))
	require.NoError(t, err)
	select {
	case <-reg.Accepted():
	case <-time.After(timeout):
		t.Fatal("the registration was not accepted")
	}
	registered := func() int64 {
		c, done := context.WithTimeout(context.Background(), timeout)
		defer done()
		r, err := cli.Get(c, prefix+"/"+etcdstore.RegistrationsDir+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		require.NoError(t, err)
		return r.Count
	}
	require.EqualValues(t, 1, registered())
	p.Stall()
	require.Eventually(t, func() bool { return registered() == 0 }, 10*ttl+timeout, 50*time.Millisecond,
		"a silent registrant still registered")
}
