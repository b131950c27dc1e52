package etcdstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/controlplane"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// ReplicasDir is the folder of the replicas' addresses under the prefix:
// PREFIX/replicas/ADDR, each key under a lease of the replica that serves
// there ([WithReplica]), so that the others know whom to ask when they
// lose etcd.
const ReplicasDir = "replicas"

// DefaultStaleAfter is how long a replica may fail to read etcd before it
// counts as stale ([WithStaleAfter]): longer than an etcd leader election
// takes, short enough that its clients move to a replica that follows
// etcd within seconds.
const DefaultStaleAfter = 5 * time.Second

// replicaTTL is the lease TTL of a replica's address key: how long the
// address of a replica that died stays listed.
const replicaTTL = 10 * time.Second

// replicaCallTimeout bounds the writes of a replica's address key.
const replicaCallTimeout = 5 * time.Second

// WithReplica makes srv's health ([controlplane.Server.SetHealth]) follow
// the watch, and lists addr (host:port of srv's plaintext gRPC APIs, ""
// for none) under PREFIX/replicas/ for the other replicas. While the
// replica reads etcd, srv is Current. Once it has failed to read etcd for
// [WithStaleAfter] (etcd out of reach, no leader, the watch broken), srv
// goes on Standby if another listed replica has answered, for as long,
// that it is Current (gRPC's health service, over plaintext), so that
// srv's clients move there; else srv is Stale and serves its last state.
// It serves again as soon as it reads etcd, or when no other replica is
// Current any more. A replica without an address still hands its clients
// over, but is never handed any. Nil srv changes nothing.
func WithReplica(srv *controlplane.Server, addr string) Option {
	return func(c *config) {
		if srv != nil {
			c.srv, c.addr = srv, addr
		}
	}
}

// WithStaleAfter sets how long a replica may fail to read etcd before it
// counts as stale, and how long another replica must have been Current
// before this one hands its clients over (default [DefaultStaleAfter]);
// etcd is read every fifth of it. d <= 0 changes nothing.
func WithStaleAfter(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.staleAfter = d
		}
	}
}

// replica keeps a Server's health in step with the watcher's etcd.
type replica struct {
	w          *watcher
	srv        *controlplane.Server
	addr       string
	staleAfter time.Duration
	interval   time.Duration // between reads of etcd; also their timeout

	lease clientv3.LeaseID // of the address key, once written

	// Owned by run.
	lastCurrent time.Time            // the last read of etcd, with the watch up
	peerSince   map[string]time.Time // since when each peer answers Current
	health      controlplane.Health
}

func newReplica(w *watcher, cfg config) *replica {
	return &replica{w: w, srv: cfg.srv, addr: cfg.addr, staleAfter: cfg.staleAfter,
		interval: max(cfg.staleAfter/5, 50*time.Millisecond), lastCurrent: time.Now(),
		peerSince: make(map[string]time.Time), health: controlplane.Current}
}

// run checks etcd every interval until ctx is done.
func (r *replica) run(ctx context.Context) {
	t := time.NewTicker(r.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.check(ctx)
	}
}

// check reads the replicas' addresses from etcd and sets the Server's
// health.
func (r *replica) check(ctx context.Context) {
	now := time.Now()
	peers, err := r.read(ctx)
	if err == nil && !r.w.following.Load() {
		err = errors.New("etcd: the watch is not established")
	}
	if ctx.Err() != nil {
		return
	}
	if err == nil {
		r.w.setPeers(peers)
		r.lastCurrent = now
		clear(r.peerSince)
		r.set(controlplane.Current, nil, "")
		return
	}
	// Peers are asked from the first failure on, so that one that
	// answers Current for long enough is known by the time this replica
	// counts as stale.
	peer := r.currentPeer(ctx, now)
	if now.Sub(r.lastCurrent) < r.staleAfter || ctx.Err() != nil {
		return
	}
	if peer != "" {
		r.set(controlplane.Standby, err, peer)
	} else {
		r.set(controlplane.Stale, err, "")
	}
}

// set sets the Server's health and logs a change, with its reason.
func (r *replica) set(h controlplane.Health, err error, peer string) {
	if h == r.health {
		return
	}
	r.health = h
	log := r.w.log.Slog()
	switch h {
	case controlplane.Current:
		log.Info("etcd: reading etcd again; serving", "prefix", r.w.prefix)
	case controlplane.Stale:
		log.Warn("etcd: cannot read etcd; no other replica reads it either: serving the last state known",
			"prefix", r.w.prefix, "since", r.lastCurrent, "err", err)
	case controlplane.Standby:
		log.Warn("etcd: cannot read etcd, and another replica reads it: standing by so that the clients move there",
			"prefix", r.w.prefix, "since", r.lastCurrent, "replica", peer, "err", err)
	}
	r.srv.SetHealth(h)
}

// read reads the replicas' addresses (linearizable: etcd's leader
// answers), within an interval.
func (r *replica) read(ctx context.Context) ([]string, error) {
	rctx, cancel := context.WithTimeout(ctx, r.interval)
	defer cancel()
	dir := r.w.prefix + ReplicasDir + "/"
	resp, err := r.w.cli.Get(rctx, dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("etcd: reading %s: %w", dir, err)
	}
	var peers []string
	for _, kv := range resp.Kvs {
		if a := strings.TrimPrefix(string(kv.Key), dir); a != "" {
			peers = append(peers, a)
		}
	}
	return peers, nil
}

// currentPeer asks every known peer whether it is Current and returns the
// first that has answered so for staleAfter, or "".
func (r *replica) currentPeer(ctx context.Context, now time.Time) string {
	peers := r.w.peerList(r.addr)
	current := make([]bool, len(peers))
	var wg sync.WaitGroup
	for i, addr := range peers {
		wg.Go(func() { current[i] = r.askPeer(ctx, addr) })
	}
	wg.Wait()
	for addr := range r.peerSince {
		if !slices.Contains(peers, addr) {
			delete(r.peerSince, addr)
		}
	}
	found := ""
	for i, addr := range peers {
		if !current[i] {
			delete(r.peerSince, addr)
			continue
		}
		since, ok := r.peerSince[addr]
		if !ok {
			since = now
			r.peerSince[addr] = now
		}
		if found == "" && now.Sub(since) >= r.staleAfter {
			found = addr
		}
	}
	return found
}

// askPeer reports whether the replica at addr answers, within an
// interval, that it is Current.
func (r *replica) askPeer(ctx context.Context, addr string) bool {
	cc, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return false
	}
	defer cc.Close()
	actx, cancel := context.WithTimeout(ctx, r.interval)
	defer cancel()
	resp, err := healthpb.NewHealthClient(cc).Check(actx, &healthpb.HealthCheckRequest{Service: controlplane.CurrentHealthService})
	return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
}

// publish writes the replica's address key under a new lease.
func (r *replica) publish(ctx context.Context) error {
	key := r.w.prefix + ReplicasDir + "/" + r.addr
	cctx, cancel := context.WithTimeout(ctx, replicaCallTimeout)
	defer cancel()
	grant, err := r.w.cli.Grant(cctx, int64(replicaTTL/time.Second))
	if err == nil {
		_, err = r.w.cli.Put(cctx, key, "", clientv3.WithLease(grant.ID))
	}
	if err != nil {
		return fmt.Errorf("etcd: writing %s: %w", key, err)
	}
	r.lease = grant.ID
	return nil
}

// announce keeps the replica's address key in etcd (written by publish,
// or written again here) until ctx is done, then deletes it.
func (r *replica) announce(ctx context.Context) {
	seq := backoff.NewSequence(r.w.retry)
	for ctx.Err() == nil {
		var err error
		if r.lease == 0 {
			err = r.publish(ctx)
		}
		if err == nil {
			seq.Reset()
			err = r.keep(ctx)
			r.lease = 0
		}
		if ctx.Err() != nil {
			return
		}
		r.w.log.WarnErr("replica key", "etcd: cannot keep this replica's address in etcd; trying again", err, "addr", r.addr)
		if backoff.Wait(ctx, seq.Next()) != nil {
			return
		}
	}
}

// keep keeps the address key's lease alive until it is lost or ctx is
// done; then it revokes it, so that the others stop asking this replica at
// once.
func (r *replica) keep(ctx context.Context) error {
	ch, err := r.w.cli.KeepAlive(ctx, r.lease)
	if err == nil {
		for range ch {
		}
	}
	if ctx.Err() != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		_, _ = r.w.cli.Revoke(rctx, r.lease)
		cancel()
		return nil
	}
	if err != nil {
		return fmt.Errorf("etcd: keeping the lease of this replica's address alive: %w", err)
	}
	return errors.New("etcd: the lease of this replica's address expired")
}

// setPeers replaces the replicas' addresses.
func (w *watcher) setPeers(addrs []string) {
	w.peersMu.Lock()
	defer w.peersMu.Unlock()
	w.peers = make(map[string]bool, len(addrs))
	for _, a := range addrs {
		w.peers[a] = true
	}
}

// setPeer adds or removes the address of a replica.
func (w *watcher) setPeer(addr string, listed bool) {
	w.peersMu.Lock()
	defer w.peersMu.Unlock()
	if w.peers == nil {
		w.peers = make(map[string]bool)
	}
	if listed && addr != "" {
		w.peers[addr] = true
	} else {
		delete(w.peers, addr)
	}
}

// peerList returns the replicas' addresses but self, sorted.
func (w *watcher) peerList(self string) []string {
	w.peersMu.Lock()
	defer w.peersMu.Unlock()
	out := make([]string, 0, len(w.peers))
	for a := range w.peers {
		if a != self {
			out = append(out, a)
		}
	}
	slices.Sort(out)
	return out
}
