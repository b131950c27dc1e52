// Package etcdtest starts a real etcd member, from etcd's embed package,
// for the tests of the control plane on etcd: its client URL is a port of
// 127.0.0.1 that the kernel picked, its data in the test's temporary
// directory.
package etcdtest

import (
	"net/url"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Member is a running single-member etcd cluster.
type Member struct {
	Etcd *embed.Etcd
	// Endpoint is the client URL, such as "http://127.0.0.1:41234".
	Endpoint string
}

// Start starts a single-member etcd cluster on ports of 127.0.0.1 that the
// kernel picks, stopped when the test ends.
func Start(t testing.TB) *Member {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = t.TempDir()
	cfg.Logger = "zap"
	cfg.LogLevel = "error"
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
	local := func() []url.URL { return []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}} }
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = local(), local()
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = local(), local()
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		t.Fatalf("etcdtest: starting etcd: %v", err)
	}
	t.Cleanup(e.Close)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		t.Fatal("etcdtest: etcd not ready within 30s")
	}
	return &Member{Etcd: e, Endpoint: "http://" + e.Clients[0].Addr().String()}
}
