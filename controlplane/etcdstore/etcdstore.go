// Package etcdstore feeds a [controlplane.Store] from etcd, so that any
// number of control-plane replicas over one etcd cluster serve the same
// answers: the Destination, OutboundPolicies and InboundServerPolicies APIs
// from the same manifests and endpoints as from files, with the same
// validation and the same last-good-state rule.
//
// The keys live under one prefix (for example "/inmesh"):
//
//	PREFIX/manifests/NAME   the bytes of manifest YAML documents, as in a file (ServiceProfiles,
//	                        Services, HTTPRoutes, GRPCRoutes, Pods, Servers, ...)
//	PREFIX/endpoints/NAME   the bytes of one endpoints file (manifest.ParseEndpoints)
//	PREFIX/registrations/AUTHORITY/ADDR/LEASE
//	                        an endpoint a workload registered ([Registry]), under
//	                        the lease of its registration
//	PREFIX/replicas/ADDR    the address of a replica ([WithReplica]), under its lease
//
// NAME may hold slashes: [Apply] keeps each resource under its own key,
// PREFIX/manifests/KIND/NAMESPACE/NAME, as kubectl apply keeps one object
// per resource; a key written by hand may hold a whole file.
//
// A key takes the place of a file name: an error names the key, the
// document and the field, as in "/inmesh/manifests/authors: document 2
// (HTTPRoute default/authors): spec.rules[0]...". As with a directory of
// files, the manifests are loaded together: one bad key refuses the whole
// change, logged with its key, and the store keeps serving the last good
// state until every key is good again. The endpoints keys are loaded
// together the same way; an authority given by two keys is an error naming
// both. Registered endpoints are served beside them; a registration key
// that does not parse is skipped and logged. Other keys under the prefix are ignored, for the kinds of keys
// that later versions add.
//
// [Watch] reads every key at one revision, then follows etcd's watch from
// the next revision: a replica whose connection breaks resumes from the last
// revision it saw, missing and replaying nothing; when that revision was
// compacted meanwhile it reads every key again at a new revision.
//
// A replica that cannot read etcd keeps serving what it last read, as
// clients keep what they last received: until [WithStaleAfter] has
// passed, and past it while no other replica reads etcd. With
// [WithReplica], once another replica that reads etcd is found, its
// Server goes on standby (controlplane.Standby) and its clients move to
// that replica; it serves again as soon as it reads etcd, and the clients
// that moved stay where they are.
package etcdstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/balancer/endpoint"
	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/ratelog"
	"github.com/inmesh/inmesh/manifest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The folders under the prefix.
const (
	ManifestsDir = "manifests"
	EndpointsDir = "endpoints"
)

// ManifestKey returns the key of the manifest file name under prefix.
func ManifestKey(prefix, name string) string {
	return cleanPrefix(prefix) + "/" + ManifestsDir + "/" + name
}

// EndpointsKey returns the key of the endpoints file name under prefix.
func EndpointsKey(prefix, name string) string {
	return cleanPrefix(prefix) + "/" + EndpointsDir + "/" + name
}

func cleanPrefix(prefix string) string { return strings.TrimRight(prefix, "/") }

// Option configures [Watch].
type Option func(*config)

type config struct {
	logger      *slog.Logger
	logInterval time.Duration
	retry       backoff.Policy
	start       time.Duration
	// The replica whose health follows the watch (replica.go).
	srv        *controlplane.Server
	addr       string
	staleAfter time.Duration
}

// WithLogger sets the logger (default slog.Default()) of rejected keys,
// reloads and broken watches. Nil changes nothing.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithLogInterval sets how often each kind of line is written at most, with
// the number of lines suppressed meanwhile attached to the next (default
// 10s). d <= 0 changes nothing.
func WithLogInterval(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.logInterval = d
		}
	}
}

// WithRetry sets the backoff between attempts to watch again after the
// watch failed (default [backoff.DefaultPolicy]). A policy that does not
// validate changes nothing.
func WithRetry(p backoff.Policy) Option {
	return func(c *config) {
		if p.Validate() == nil {
			c.retry = p
		}
	}
}

// WithStartTimeout bounds the first read of the keys by [Watch], which
// otherwise waits for etcd as long as its context lasts. d <= 0 changes
// nothing.
func WithStartTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.start = d
		}
	}
}

// Watch loads the manifests and endpoints under prefix into store, then
// follows etcd's watch and loads what changed, until ctx is done. It
// returns the error of the first load (etcd unreachable within ctx or
// [WithStartTimeout], or a bad key), without watching. After that, a bad
// key is logged with its key, document and field, and the store keeps
// serving the last good state; a broken watch is retried with backoff from
// the last revision seen. Manifests that load but cannot work as written
// ([manifest.Resources.Problems]) are logged at every load of them.
//
// With [WithReplica], the replica's Server hands its clients over to
// another replica while it cannot read etcd and the other can, and serves
// its last state while no replica can.
//
// The watch goes on in a goroutine of its own; wait, once ctx is done,
// returns when it has returned: nothing is loaded into store after that.
// The client is the caller's, and stays open: cancel ctx, call wait, then
// close the client. When Watch fails, there is no goroutine and wait
// returns at once.
func Watch(ctx context.Context, store *controlplane.Store, cli *clientv3.Client, prefix string, opts ...Option) (wait func(), err error) {
	cfg := config{logger: slog.Default(), retry: backoff.DefaultPolicy(), staleAfter: DefaultStaleAfter}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	w := &watcher{store: store, cli: cli, prefix: cleanPrefix(prefix) + "/",
		log: ratelog.New(cfg.logger, cfg.logInterval), retry: cfg.retry}
	start, cancel := ctx, context.CancelFunc(func() {})
	if cfg.start > 0 {
		start, cancel = context.WithTimeout(ctx, cfg.start)
	}
	var r *replica
	if cfg.srv != nil {
		r = newReplica(w, cfg)
		if r.addr != "" {
			// Listed before the first read, so that every replica that
			// reads after this one has started knows it. A failure is
			// tried again in the background.
			if err := r.publish(start); err != nil {
				w.log.WarnErr("replica key", "etcd: cannot list this replica's address in etcd; trying again", err, "addr", r.addr)
			}
		}
	}
	bad, err := w.reload(start)
	cancel()
	if err == nil && bad != nil {
		err = bad
	}
	if err != nil {
		if r != nil && r.lease != 0 {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			_, _ = cli.Revoke(rctx, r.lease)
			cancel()
		}
		return func() {}, err
	}
	var workers sync.WaitGroup
	workers.Go(func() { w.run(ctx) })
	if r != nil {
		r.lastCurrent = time.Now()
		cfg.srv.SetHealth(controlplane.Current)
		workers.Go(func() { r.run(ctx) })
		if r.addr != "" {
			workers.Go(func() { r.announce(ctx) })
		}
	}
	return workers.Wait, nil
}

type watcher struct {
	store  *controlplane.Store
	cli    *clientv3.Client
	prefix string // ends with "/"
	log    *ratelog.Logger
	retry  backoff.Policy

	// following is true while the watch is established (etcd
	// confirmed its creation), false while it is broken or being set up.
	following atomic.Bool
	// peers are the addresses under ReplicasDir (replica.go), as read
	// last by the watch or by a replica's check.
	peersMu sync.Mutex
	peers   map[string]bool

	rev       int64             // the revision the state below is at
	manifests map[string][]byte // by key
	endpoints map[string][]byte // by key
	// registrations by key; loadedRegistrations what was last loaded.
	registrations, loadedRegistrations map[string][]byte
	// What was loaded into the store last (good or not), so that a change
	// outside the keys read (or a reload that finds the same keys) does not
	// wake every stream.
	loadedManifests, loadedEndpoints map[string][]byte
	// parsedEndpoints are the sets of each endpoints key as last parsed
	// (or why it did not parse), and served the sets the store was last
	// given, by authority: a change parses only the keys that changed and
	// gives the store only the sets that changed.
	parsedEndpoints map[string]parsedSets
	served          map[string][]endpoint.Endpoint
	// parsedRegistrations are the registration keys as last parsed, and
	// servedRegistered the registered sets the store was last given.
	parsedRegistrations map[string]parsedRegistration
	servedRegistered    map[string][]endpoint.Endpoint
	// Why the manifests and the endpoints last loaded were refused (nil:
	// they were not): a refusal holds until keys that load replace it.
	manifestsErr, endpointsErr error
	// rejected says the last load was refused, so that the next one that
	// loads is logged however soon it comes (the fix confirmed), and the
	// next refusal after a good load too; troubled, that the last load
	// had problems (logged), and problems how many the manifests last
	// loaded have: a load after a troubled one is logged the same way.
	rejected, troubled bool
	problems           int
}

// report logs the outcome of a load at the watcher's revision: a refusal,
// or the keys loaded. A change between the two is always logged, past the
// rate limit of either line.
func (w *watcher) report(err error) {
	if err != nil {
		if !w.rejected {
			w.log.Forget("rejected key")
		}
		w.rejected = true
		w.log.WarnErr("rejected key", "etcd: rejected a control-plane key; serving the last good state", err, "prefix", w.prefix, "revision", w.rev)
		return
	}
	if w.rejected || w.troubled {
		w.log.Forget("loaded")
	}
	w.rejected, w.troubled = false, w.problems > 0
	w.log.Info("loaded", "etcd: loaded the control-plane keys", "prefix", w.prefix, "revision", w.rev)
}

// reload reads every key at the current revision and loads them. It
// returns the error of a bad key (the state read is kept, to be followed
// from its revision), or of a read that failed (nothing changed).
func (w *watcher) reload(ctx context.Context) (bad, err error) {
	resp, err := w.cli.Get(ctx, w.prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("etcd: reading %s: %w", w.prefix, err)
	}
	w.manifests, w.endpoints, w.registrations = make(map[string][]byte), make(map[string][]byte), make(map[string][]byte)
	w.setPeers(nil)
	for _, kv := range resp.Kvs {
		w.put(string(kv.Key), kv.Value)
	}
	w.rev = resp.Header.Revision
	return w.load(), nil
}

func (w *watcher) put(key string, value []byte) {
	switch w.kind(key) {
	case ManifestsDir:
		w.manifests[key] = value
	case EndpointsDir:
		w.endpoints[key] = value
	case RegistrationsDir:
		w.registrations[key] = value
	case ReplicasDir:
		w.setPeer(strings.TrimPrefix(key, w.prefix+ReplicasDir+"/"), true)
	}
}

func (w *watcher) delete(key string) {
	delete(w.manifests, key)
	delete(w.endpoints, key)
	delete(w.registrations, key)
	if w.kind(key) == ReplicasDir {
		w.setPeer(strings.TrimPrefix(key, w.prefix+ReplicasDir+"/"), false)
	}
}

// kind returns the folder of a key, or "" for a key not read here.
func (w *watcher) kind(key string) string {
	rest, ok := strings.CutPrefix(key, w.prefix)
	if !ok {
		return ""
	}
	dir, name, ok := strings.Cut(rest, "/")
	if !ok || name == "" {
		return ""
	}
	if dir == ManifestsDir || dir == EndpointsDir || dir == RegistrationsDir || dir == ReplicasDir {
		return dir
	}
	return ""
}

// load loads the manifests and endpoints that differ from the last load.
// Either set is refused whole when any of its keys is bad, the store
// keeping what it served.
func (w *watcher) load() error {
	if !maps.EqualFunc(w.manifests, w.loadedManifests, bytes.Equal) {
		w.loadedManifests = maps.Clone(w.manifests)
		var files []manifest.File
		for _, k := range slices.Sorted(maps.Keys(w.manifests)) {
			files = append(files, manifest.File{Name: k, Data: w.manifests[k]})
		}
		r, err := manifest.LoadFiles(files...)
		w.manifestsErr = err
		if err == nil {
			w.store.SetServiceProfiles(r.ServiceProfiles)
			w.store.SetManifests(r)
			names, problems := w.store.ProfileNameProblems(), w.store.ManifestProblems()
			for _, err := range names {
				w.log.WarnErr("profile name", "a loaded ServiceProfile will never apply", err, "prefix", w.prefix)
			}
			for _, err := range problems {
				w.log.WarnErr("manifest problem", "a loaded policy manifest cannot work as written", err, "prefix", w.prefix)
			}
			w.problems = len(names) + len(problems)
		}
	}
	if !maps.EqualFunc(w.endpoints, w.loadedEndpoints, bytes.Equal) {
		w.loadedEndpoints = maps.Clone(w.endpoints)
		sets, err := w.parseEndpoints()
		w.endpointsErr = err
		if err == nil {
			w.updateEndpoints(sets)
		}
	}
	if !maps.EqualFunc(w.registrations, w.loadedRegistrations, bytes.Equal) {
		w.loadedRegistrations = maps.Clone(w.registrations)
		w.updateRegistered(w.parseRegistrations())
	}
	return errors.Join(w.manifestsErr, w.endpointsErr)
}

// registrationsID names, in the Store, every registration etcd holds.
const registrationsID = "etcd"

// parsedRegistration is a registration key as parsed: its authority and
// endpoint, or why it did not parse.
type parsedRegistration struct {
	value     []byte
	authority string
	endpoint  endpoint.Endpoint
	err       error
}

// parseRegistrations returns the registered endpoints by authority; a key
// that does not parse is logged and skipped. Only the keys whose values
// changed since the last call are parsed.
func (w *watcher) parseRegistrations() map[string][]endpoint.Endpoint {
	parsed := make(map[string]parsedRegistration, len(w.registrations))
	out := make(map[string][]endpoint.Endpoint)
	for _, k := range slices.Sorted(maps.Keys(w.registrations)) {
		v := w.registrations[k]
		p, ok := w.parsedRegistrations[k]
		if !ok || !bytes.Equal(p.value, v) {
			p = parsedRegistration{value: v}
			p.authority, p.endpoint, p.err = parseRegistration(strings.TrimPrefix(k, w.prefix+RegistrationsDir+"/"), v)
		}
		parsed[k] = p
		if p.err != nil {
			w.log.WarnErr("bad registration", "etcd: skipping a registration key that does not parse", p.err, "key", k)
			continue
		}
		out[p.authority] = append(out[p.authority], p.endpoint)
	}
	w.parsedRegistrations = parsed
	return out
}

// parsedSets are the sets of an endpoints key as parsed, or why it did
// not parse.
type parsedSets struct {
	value []byte
	sets  map[string][]endpoint.Endpoint
	err   error
}

// parseEndpoints merges the endpoints keys; an authority given by two keys
// is an error naming both. Only the keys whose values changed since the
// last call are parsed.
func (w *watcher) parseEndpoints() (map[string][]endpoint.Endpoint, error) {
	parsed := make(map[string]parsedSets, len(w.endpoints))
	for k, v := range w.endpoints {
		p, ok := w.parsedEndpoints[k]
		if !ok || !bytes.Equal(p.value, v) {
			p = parsedSets{value: v}
			p.sets, p.err = manifest.ParseEndpoints(v)
		}
		parsed[k] = p
	}
	w.parsedEndpoints = parsed
	out := make(map[string][]endpoint.Endpoint)
	from := make(map[string]string)
	for _, k := range slices.Sorted(maps.Keys(parsed)) {
		p := parsed[k]
		if p.err != nil {
			return nil, fmt.Errorf("%s: %w", k, p.err)
		}
		for _, a := range slices.Sorted(maps.Keys(p.sets)) {
			if prev, dup := from[a]; dup {
				return nil, fmt.Errorf("%s: authority %s is also given in %s", k, a, prev)
			}
			from[a] = k
			out[a] = p.sets[a]
		}
	}
	return out, nil
}

// updateEndpoints gives the store the sets that differ from those it was
// last given, and the authorities that are gone, in one change: a change
// to one key costs the store that key's sets, not every set. The first
// load replaces every set the store held.
func (w *watcher) updateEndpoints(sets map[string][]endpoint.Endpoint) {
	if w.served == nil {
		// The first load replaces whatever the store held.
		w.served = sets
		w.store.SetEndpoints(sets)
		return
	}
	changed, deleted := changedSets(w.served, sets)
	w.served = sets
	if len(changed) > 0 || len(deleted) > 0 {
		w.store.UpdateEndpoints(changed, deleted)
	}
}

// updateRegistered gives the store the registered sets that differ from
// those it was last given, and the authorities no longer registered, as
// updateEndpoints does for the endpoints keys.
func (w *watcher) updateRegistered(sets map[string][]endpoint.Endpoint) {
	if w.servedRegistered == nil {
		w.servedRegistered = sets
		w.store.PutRegistered(registrationsID, sets)
		return
	}
	changed, deleted := changedSets(w.servedRegistered, sets)
	w.servedRegistered = sets
	if len(changed) > 0 || len(deleted) > 0 {
		w.store.UpdateRegistered(registrationsID, changed, deleted)
	}
}

// changedSets returns the sets of cur that differ from those of prev, and
// the authorities of prev that cur does not have.
func changedSets(prev, cur map[string][]endpoint.Endpoint) (changed map[string][]endpoint.Endpoint, deleted []string) {
	changed = make(map[string][]endpoint.Endpoint)
	for a, eps := range cur {
		if p, ok := prev[a]; !ok || !slices.EqualFunc(p, eps, sameEndpoint) {
			changed[a] = eps
		}
	}
	for a := range prev {
		if _, ok := cur[a]; !ok {
			deleted = append(deleted, a)
		}
	}
	return changed, deleted
}

// sameEndpoint reports whether two endpoints of a set are the same.
func sameEndpoint(a, b endpoint.Endpoint) bool { return reflect.DeepEqual(a, b) }

// run follows the watch from w.rev+1 until ctx is done, resuming after
// every failure from the last revision seen.
func (w *watcher) run(ctx context.Context) {
	seq := backoff.NewSequence(w.retry)
	for ctx.Err() == nil {
		compacted, progressed, err := w.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		if progressed {
			seq.Reset()
		}
		if !compacted {
			w.log.WarnErr("etcd watch", "etcd: the watch broke; resuming from the last revision seen", err, "prefix", w.prefix, "revision", w.rev+1)
			if backoff.Wait(ctx, seq.Next()) != nil {
				return
			}
			continue
		}
		w.log.Slog().Warn("etcd: the revision to resume from was compacted; reading every key again", "prefix", w.prefix, "revision", w.rev+1)
		for {
			bad, err := w.reload(ctx)
			if err == nil {
				w.log.Slog().Info("etcd: read every key again", "prefix", w.prefix, "revision", w.rev)
				w.report(bad)
				break
			}
			w.log.WarnErr("etcd reload", "etcd: cannot read the keys after a compaction; serving the last good state", err, "prefix", w.prefix)
			if backoff.Wait(ctx, seq.Next()) != nil {
				return
			}
		}
	}
}

// follow watches from w.rev+1 and loads every change until the watch ends.
// It reports whether the revision was compacted and whether any response
// arrived.
func (w *watcher) follow(ctx context.Context) (compacted, progressed bool, err error) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	defer w.following.Store(false)
	ch := w.cli.Watch(wctx, w.prefix, clientv3.WithPrefix(), clientv3.WithRev(w.rev+1), clientv3.WithProgressNotify(),
		clientv3.WithCreatedNotify())
	for resp := range ch {
		if resp.CompactRevision != 0 {
			return true, progressed, nil
		}
		if err := resp.Err(); err != nil {
			return false, progressed, err
		}
		if resp.Created {
			w.following.Store(true)
			continue
		}
		progressed = true
		if resp.IsProgressNotify() {
			// Every event up to this revision was sent.
			w.rev = max(w.rev, resp.Header.Revision)
			continue
		}
		for _, ev := range resp.Events {
			key := string(ev.Kv.Key)
			switch ev.Type {
			case clientv3.EventTypePut:
				w.put(key, ev.Kv.Value)
			case clientv3.EventTypeDelete:
				w.delete(key)
			}
			w.rev = max(w.rev, ev.Kv.ModRevision)
		}
		w.report(w.load())
	}
	return false, progressed, errors.New("etcd: the watch ended")
}
