package etcdtest

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// Cluster is a running etcd cluster of several members in this process, on
// loopback. Each member's client and peer URLs are ports of 127.0.0.1 that
// the kernel picked and that stay held for the life of the cluster: a relay
// listens there and forwards to the member, so that the peer URLs are
// known before any member starts (etcd needs them in its initial
// cluster), and so that [Cluster.Kill] can cut every connection to a
// member at once, as a crash of its machine would.
type Cluster struct {
	Members []*ClusterMember
}

// ClusterMember is one member of a [Cluster].
type ClusterMember struct {
	Name string
	// Endpoint is the member's client URL, such as "http://127.0.0.1:41234".
	Endpoint string
	// PeerURL is the member's peer URL, as the other members reach it.
	PeerURL string
	Etcd    *embed.Etcd

	client, peer *relay
	stopOnce     sync.Once
	stopped      atomic.Bool
}

// StartCluster starts a cluster of size members (three for the failure
// tests: one may die and a quorum stays), stopped when the test ends.
func StartCluster(t testing.TB, size int) *Cluster {
	t.Helper()
	c, err := NewCluster(t.TempDir(), size)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// NewCluster starts a cluster of size members with their data under dir,
// and returns once every member serves. Close stops it.
func NewCluster(dir string, size int) (*Cluster, error) {
	if size < 1 {
		return nil, fmt.Errorf("a cluster of %d members", size)
	}
	c := &Cluster{}
	fail := func(err error) (*Cluster, error) {
		c.Close()
		return nil, err
	}
	var initial []string
	for i := range size {
		m := &ClusterMember{Name: fmt.Sprintf("member%d", i)}
		var err error
		if m.client, err = newRelay(); err != nil {
			return fail(err)
		}
		if m.peer, err = newRelay(); err != nil {
			m.client.close()
			return fail(err)
		}
		m.Endpoint, m.PeerURL = "http://"+m.client.addr(), "http://"+m.peer.addr()
		initial = append(initial, m.Name+"="+m.PeerURL)
		c.Members = append(c.Members, m)
	}
	for _, m := range c.Members {
		cfg := embed.NewConfig()
		cfg.Name = m.Name
		cfg.Dir = filepath.Join(dir, m.Name)
		cfg.Logger = "zap"
		cfg.LogLevel = "error"
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		// The member binds ports the kernel picks; the held relays are
		// its advertised URLs.
		loopback := []url.URL{{Scheme: "http", Host: "127.0.0.1:0"}}
		cfg.ListenClientUrls, cfg.ListenPeerUrls = loopback, loopback
		cfg.AdvertiseClientUrls = []url.URL{{Scheme: "http", Host: m.client.addr()}}
		cfg.AdvertisePeerUrls = []url.URL{{Scheme: "http", Host: m.peer.addr()}}
		cfg.InitialCluster = strings.Join(initial, ",")
		cfg.InitialClusterToken = "etcdtest"
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			return fail(fmt.Errorf("starting etcd %s: %w", m.Name, err))
		}
		m.Etcd = e
		m.client.setTarget(e.Clients[0].Addr().String())
		m.peer.setTarget(e.Peers[0].Addr().String())
	}
	deadline := time.After(60 * time.Second)
	for _, m := range c.Members {
		select {
		case <-m.Etcd.Server.ReadyNotify():
		case err := <-m.Etcd.Err():
			return fail(fmt.Errorf("etcd %s: %w", m.Name, err))
		case <-deadline:
			return fail(errors.New("the etcd cluster was not ready within 60s"))
		}
	}
	return c, nil
}

// Endpoints returns the client URLs of every member, the dead ones
// included, as a client is configured.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.Endpoint)
	}
	return out
}

// Leader returns the index of the live member that leads the cluster as
// far as the first live member knows, or -1 while there is none (during an
// election).
func (c *Cluster) Leader() int {
	for _, m := range c.Members {
		if m.Etcd == nil || m.stopped.Load() {
			continue
		}
		lead := uint64(m.Etcd.Server.Leader())
		for i, o := range c.Members {
			if o.Etcd != nil && !o.stopped.Load() && uint64(o.Etcd.Server.MemberID()) == lead {
				return i
			}
		}
		return -1
	}
	return -1
}

// Kill crashes member i, as a SIGKILL or the loss of its machine would:
// every connection to it, from clients and from the other members, is cut
// at once and new ones are refused, and it stops without handing its
// leadership over. Its ports stay held, so that nothing else takes them.
func (c *Cluster) Kill(i int) {
	m := c.Members[i]
	m.client.cut()
	m.peer.cut()
	m.stop(true)
}

// Stop stops member i gracefully: a leader hands its leadership over, open
// requests end, then its ports refuse connections.
func (c *Cluster) Stop(i int) {
	m := c.Members[i]
	m.stop(false)
	m.client.cut()
	m.peer.cut()
}

func (m *ClusterMember) stop(hard bool) {
	m.stopped.Store(true)
	m.stopOnce.Do(func() {
		if m.Etcd == nil {
			return
		}
		if hard {
			m.Etcd.Server.HardStop()
		}
		m.Etcd.Close()
	})
}

// Close stops every member and releases the ports.
func (c *Cluster) Close() {
	for _, m := range c.Members {
		m.client.cut()
		m.peer.cut()
		m.stop(true)
		m.client.close()
		m.peer.close()
	}
}

// relay holds a port of 127.0.0.1 and forwards the connections it accepts
// to its target, until it is cut.
type relay struct {
	lis    net.Listener
	mu     sync.Mutex
	target string
	down   bool
	conns  map[net.Conn]struct{}
}

func newRelay() (*relay, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &relay{lis: lis, conns: make(map[net.Conn]struct{})}
	go r.serve()
	return r, nil
}

func (r *relay) addr() string { return r.lis.Addr().String() }

func (r *relay) setTarget(t string) {
	r.mu.Lock()
	r.target = t
	r.mu.Unlock()
}

func (r *relay) serve() {
	for {
		c, err := r.lis.Accept()
		if err != nil {
			return
		}
		go r.forward(c)
	}
}

// forward pipes c to the target; before the target is known, or once the
// relay is cut, c is closed at once (the member is not there).
func (r *relay) forward(c net.Conn) {
	r.mu.Lock()
	target, down := r.target, r.down
	r.mu.Unlock()
	if down || target == "" {
		c.Close()
		return
	}
	u, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		c.Close()
		return
	}
	r.mu.Lock()
	if r.down {
		r.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	r.conns[c], r.conns[u] = struct{}{}, struct{}{}
	r.mu.Unlock()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		done <- struct{}{}
	}
	go pipe(u, c)
	go pipe(c, u)
	<-done
	c.Close()
	u.Close()
	<-done
	r.mu.Lock()
	delete(r.conns, c)
	delete(r.conns, u)
	r.mu.Unlock()
}

// cut closes every connection through the relay and refuses new ones.
func (r *relay) cut() {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.down = true
	for c := range r.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, as from a crashed peer
		}
		c.Close()
	}
	clear(r.conns)
}

func (r *relay) close() {
	if r != nil {
		r.lis.Close()
	}
}
