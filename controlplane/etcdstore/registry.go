package etcdstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RegistrationsDir is the folder of registered endpoints under the prefix:
// PREFIX/registrations/AUTHORITY/ADDR/LEASE, each key attached to the
// lease (in hex) of the registration that wrote it. A registration owns
// its keys alone: another registration of the same address (a second
// identity the manifests bind to the Service, or a workload that took
// over the address of one that died) writes keys of its own, and neither
// one's end removes the other's. An address registered twice is served
// as the key first in order gives it, the same on every replica.
const RegistrationsDir = "registrations"

// DefaultRegistrationTTL is the lease TTL of a registration: the longest a
// registered endpoint outlives its registration when the replica that
// held it died too (a replica that sees the stream end removes it at
// once). Kept alive every third of its TTL, a lease outlives the replica
// that kept it by two thirds of the TTL at least, 20 s: longer than a
// registration takes to leave a replica that froze or lost etcd and
// register with another (registration.Dial notices a frozen replica
// within 15 s), so that a live workload's endpoints never leave the
// answers meanwhile.
const DefaultRegistrationTTL = 30 * time.Second

// maxCallTimeout bounds each etcd call of a registration (see
// [Registry.callTimeout]).
const maxCallTimeout = 5 * time.Second

// RegistrationKey returns the key of an endpoint registered under lease.
func RegistrationKey(prefix, authority string, addr netip.AddrPort, lease clientv3.LeaseID) string {
	return cleanPrefix(prefix) + "/" + RegistrationsDir + "/" + strings.ToLower(authority) + "/" + addr.String() +
		"/" + strconv.FormatInt(int64(lease), 16)
}

// registered is the value of a registration key.
type registered struct {
	Weight   uint32            `json:"weight,omitempty"`
	Identity string            `json:"identity,omitempty"`
	H2       bool              `json:"h2,omitempty"`
	Opaque   bool              `json:"opaque,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
}

// Registry keeps registrations in etcd (a [controlplane.Registry], for
// controlplane.WithRegistry): each registration under a lease of its own,
// kept alive while its stream is open and revoked when it ends, so that
// every replica's [Watch] serves the endpoints, and they expire within
// the TTL when the replica that holds the stream dies. Each etcd call is
// bounded by a third of the TTL (at most 5 s): a registration through a
// replica that cannot reach etcd fails with Unavailable. It is safe for
// concurrent use.
type Registry struct {
	cli    *clientv3.Client
	prefix string
	ttl    time.Duration
}

var _ controlplane.Registry = (*Registry)(nil)

// NewRegistry returns a Registry writing under prefix; ttl <= 0 means
// [DefaultRegistrationTTL] (etcd rounds a TTL up to whole seconds, and up
// to its own minimum).
func NewRegistry(cli *clientv3.Client, prefix string, ttl time.Duration) *Registry {
	if ttl <= 0 {
		ttl = DefaultRegistrationTTL
	}
	return &Registry{cli: cli, prefix: cleanPrefix(prefix), ttl: ttl}
}

// callTimeout bounds each etcd call of a registration: a third of the
// TTL, between 1 s and 5 s. A replica that cannot reach etcd then answers
// Unavailable well before a lease runs out, rather than holding the
// workload's stream (and the workload) for as long as etcd is away.
func (r *Registry) callTimeout() time.Duration {
	return max(min(r.ttl/3, maxCallTimeout), time.Second)
}

// Open grants the registration's lease and keeps it alive until Release.
func (r *Registry) Open(ctx context.Context) (controlplane.Lease, error) {
	secs := int64((r.ttl + time.Second - 1) / time.Second)
	gctx, cancel := context.WithTimeout(ctx, r.callTimeout())
	grant, err := r.cli.Grant(gctx, secs)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("etcd: granting a lease: %w", err)
	}
	kctx, cancel := context.WithCancel(context.Background())
	ch, err := r.cli.KeepAlive(kctx, grant.ID)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("etcd: keeping lease %x alive: %w", grant.ID, err)
	}
	l := &lease{r: r, id: grant.ID, cancel: cancel, lost: make(chan struct{}), done: make(chan struct{})}
	go l.keepAlive(ch)
	return l, nil
}

type lease struct {
	r      *Registry
	id     clientv3.LeaseID
	cancel context.CancelFunc
	lost   chan struct{} // closed when the keep-alive ended before Release
	done   chan struct{} // closed when keepAlive returned

	mu       sync.Mutex
	keys     map[string]bool // written by the last Put
	released bool
}

// keepAlive drains the keep-alive answers; their end before Release means
// the lease expired or etcd stayed out of reach.
func (l *lease) keepAlive(ch <-chan *clientv3.LeaseKeepAliveResponse) {
	defer close(l.done)
	for range ch {
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.released {
		close(l.lost)
	}
}

// Put writes the endpoints under the lease and deletes the keys of the
// last Put that are gone, in one transaction.
func (l *lease) Put(ctx context.Context, sets map[string][]endpoint.Endpoint) error {
	keys := make(map[string]bool)
	var ops []clientv3.Op
	for a, eps := range sets {
		for _, e := range eps {
			v, err := json.Marshal(registered{Weight: e.Weight, Identity: e.Identity, H2: e.H2, Opaque: e.Opaque, Labels: e.Labels})
			if err != nil {
				return err
			}
			k := RegistrationKey(l.r.prefix, a, e.Addr, l.id)
			keys[k] = true
			ops = append(ops, clientv3.OpPut(k, string(v), clientv3.WithLease(l.id)))
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range slices.Sorted(maps.Keys(l.keys)) {
		if !keys[k] {
			ops = append(ops, clientv3.OpDelete(k))
		}
	}
	ctx, cancel := context.WithTimeout(ctx, l.r.callTimeout())
	defer cancel()
	if _, err := l.r.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("etcd: writing the registration: %w", err)
	}
	l.keys = keys
	return nil
}

// Release stops the keep-alive and, with remove, revokes the lease, which
// deletes its keys at once (tried again within the bound of a call, while
// etcd elects a leader); without, they expire with the lease.
func (l *lease) Release(ctx context.Context, remove bool) error {
	l.mu.Lock()
	l.released = true
	l.mu.Unlock()
	l.cancel()
	<-l.done
	if !remove {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, l.r.callTimeout())
	defer cancel()
	// etcd's client does not try a revocation again when its connection
	// broke, and etcd drops one proposed while it elects a leader: it is
	// tried again here, a second at a time, within the bound. A lease
	// already gone counts as revoked.
	seq := backoff.NewSequence(backoff.DefaultPolicy())
	for {
		actx, cancel := context.WithTimeout(ctx, revokeAttemptTimeout)
		_, err := l.r.cli.Revoke(actx, l.id)
		cancel()
		if err == nil || errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil
		}
		if backoff.Wait(ctx, seq.Next()) != nil {
			return fmt.Errorf("etcd: revoking lease %x: %w", l.id, err)
		}
	}
}

// revokeAttemptTimeout bounds one attempt of a revocation.
const revokeAttemptTimeout = time.Second

func (l *lease) Lost() <-chan struct{} { return l.lost }

// parseRegistration reads a registration key (AUTHORITY/ADDR/LEASE; a key
// without the lease, AUTHORITY/ADDR, as a registry before leases named
// keys wrote it): its authority, and its endpoint.
func parseRegistration(rest string, value []byte) (string, endpoint.Endpoint, error) {
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) == 3:
		if _, err := strconv.ParseUint(parts[2], 16, 64); err != nil {
			return "", endpoint.Endpoint{}, fmt.Errorf("lease %q is not a hex number", parts[2])
		}
	case len(parts) != 2:
		return "", endpoint.Endpoint{}, fmt.Errorf("want %s/AUTHORITY/ADDR/LEASE", RegistrationsDir)
	}
	if parts[0] == "" {
		return "", endpoint.Endpoint{}, fmt.Errorf("want %s/AUTHORITY/ADDR/LEASE", RegistrationsDir)
	}
	addr, err := netip.ParseAddrPort(parts[1])
	if err != nil {
		return "", endpoint.Endpoint{}, fmt.Errorf("address: %w", err)
	}
	var v registered
	if err := json.Unmarshal(value, &v); err != nil {
		return "", endpoint.Endpoint{}, fmt.Errorf("value: %w", err)
	}
	return parts[0], endpoint.Endpoint{Addr: addr, Weight: v.Weight, Identity: v.Identity, H2: v.H2, Opaque: v.Opaque, Labels: v.Labels}, nil
}
