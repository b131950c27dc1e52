// Package dashboard is a live page of what a mesh stack does, for the
// program to mount as it would net/http/pprof: the outbound and inbound
// routes (success rate, request rate, latency percentiles, retries), each
// outbound authority's endpoints as the balancer sees them (state, load,
// zone, identity), the inbound policy's decisions (by route, client
// identity and decision), the workload's identity and its certificate, the
// control-plane client's watches, and a tap of the requests live.
//
//	hub := tap.NewHub()
//	client := mesh.NewClient(mesh.WithTap(hub), ...)
//	d := dashboard.New(hub, dashboard.WithBalancer(client.Balancer()))
//	defer d.Close()
//	admin.Handle("/dashboard/", http.StripPrefix("/dashboard", d))
//
// It reads the library's own state (no Prometheus server is needed) and
// works offline: the page's script and styles are embedded. Its data is
// also JSON at state.json, and the tap at tap (see [tap.Hub.ServeHTTP]).
//
// Access: the dashboard answers clients on loopback only (asking for a
// loopback Host, "localhost" or a loopback address, which a page of
// another name that its DNS rebound to 127.0.0.1 does not), unless
// [WithAllowedIdentities] names the mesh identities (TLS-verified, as
// identity.PeerFromContext gives them) also admitted, or [WithAccess]
// decides. Anyone else gets 403.
package dashboard

import (
	"embed"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/tap"
)

//go:embed static
var static embed.FS

// Option configures a [Dashboard].
type Option func(*Dashboard)

// WithBalancer shows the endpoints of each outbound authority from b.
func WithBalancer(b *balancer.Balancer) Option {
	return func(d *Dashboard) {
		if b != nil {
			d.balancers = append(d.balancers, b)
		}
	}
}

// WithIdentity shows the workload's identity and its certificate.
func WithIdentity(l *identity.Local) Option { return func(d *Dashboard) { d.identity = l } }

// WithDestination shows the control-plane client's watches and the
// addresses it was given.
func WithDestination(c *destination.Client, addr string) Option {
	return func(d *Dashboard) { d.dst, d.dstAddr = c, addr }
}

// WithName names the workload on the page (e.g. the program and its
// port).
func WithName(name string) Option { return func(d *Dashboard) { d.name = name } }

// WithAllowedIdentities admits, beside loopback clients, the clients whose
// TLS-verified mesh identity is one of ids.
func WithAllowedIdentities(ids ...string) Option {
	return func(d *Dashboard) { d.allowed = append(d.allowed, ids...) }
}

// WithAccess replaces the access rule: allow decides each request.
func WithAccess(allow func(*http.Request) bool) Option {
	return func(d *Dashboard) { d.access = allow }
}

// WithClock sets the clock of the request rates (for tests).
func WithClock(now func() time.Time) Option { return func(d *Dashboard) { d.now = now } }

// Dashboard is an http.Handler serving the page, its JSON and the tap.
type Dashboard struct {
	hub       *tap.Hub
	balancers []*balancer.Balancer
	identity  *identity.Local
	dst       *destination.Client
	dstAddr   string
	name      string
	allowed   []string
	access    func(*http.Request) bool
	now       func() time.Time

	table *table
	stop  func()
	mux   *http.ServeMux
}

// New returns a dashboard of the requests hub sees; it observes hub until
// [Dashboard.Close].
func New(hub *tap.Hub, opts ...Option) *Dashboard {
	d := &Dashboard{hub: hub, now: time.Now}
	for _, o := range opts {
		o(d)
	}
	d.table = newTable(d.now)
	d.stop = hub.Observe(d.table.observe)
	d.mux = http.NewServeMux()
	d.mux.HandleFunc("GET /{$}", d.page)
	d.mux.Handle("GET /static/", http.FileServerFS(static))
	d.mux.HandleFunc("GET /state.json", d.stateJSON)
	d.mux.HandleFunc("GET /tap", hub.Stream) // admitted by the dashboard's rule
	return d
}

// Close stops observing the hub.
func (d *Dashboard) Close() { d.stop() }

// ServeHTTP serves the page (/), its data (/state.json) and the tap
// (/tap), to the clients the access rule admits.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !d.allow(r) {
		http.Error(w, "dashboard: only loopback clients and allowed identities may see this", http.StatusForbidden)
		return
	}
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'")
	d.mux.ServeHTTP(w, r)
}

func (d *Dashboard) allow(r *http.Request) bool {
	if d.access != nil {
		return d.access(r)
	}
	if p, ok := identity.PeerFromContext(r.Context()); ok && p.TLS && p.ID != "" && slices.Contains(d.allowed, p.ID) {
		return true
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback() && authority.IsLoopbackHost(r.Host)
}

func (d *Dashboard) page(w http.ResponseWriter, r *http.Request) {
	b, err := static.ReadFile("static/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(b)
}

// State is the dashboard's data, as state.json serves it.
type State struct {
	Name      string      `json:"name,omitempty"`
	Time      time.Time   `json:"time"`
	Routes    []Route     `json:"routes"`
	Endpoints []Authority `json:"endpoints"`
	Decisions []Decision  `json:"decisions"`
	Identity  *Identity   `json:"identity,omitempty"`
	Control   *Control    `json:"controlPlane,omitempty"`
	Tap       tap.Stats   `json:"tap"`
}

// Authority is an outbound authority's endpoints.
type Authority struct {
	Authority string                   `json:"authority"`
	Endpoints []balancer.EndpointState `json:"endpoints"`
}

// Identity is the workload's identity.
type Identity struct {
	Name string `json:"name"`
	// Expiry is when the current certificate expires; zero before the
	// first.
	Expiry time.Time `json:"expiry"`
	// Issuer is the subject of the certificate's issuer.
	Issuer string `json:"issuer,omitempty"`
}

// Control is the control-plane client's state.
type Control struct {
	Addr            string `json:"addr,omitempty"`
	ProfileWatches  int    `json:"profileWatches"`
	EndpointWatches int    `json:"endpointWatches"`
	PolicyWatches   int    `json:"policyWatches"`
	InboundWatches  int    `json:"inboundWatches"`
	RejectedWatches uint64 `json:"rejectedWatches"`
}

// State returns the dashboard's data now.
func (d *Dashboard) State() State {
	routes, decisions := d.table.snapshot()
	s := State{Name: d.name, Time: d.now(), Routes: routes, Decisions: decisions, Tap: d.hub.Stats(), Endpoints: []Authority{}}
	seen := map[string]bool{}
	for _, r := range routes {
		if r.Direction != "outbound" || seen[r.Authority] {
			continue
		}
		seen[r.Authority] = true
		for _, b := range d.balancers {
			if eps := b.Endpoints(r.Authority); eps != nil {
				s.Endpoints = append(s.Endpoints, Authority{Authority: r.Authority, Endpoints: eps})
				break
			}
		}
	}
	if l := d.identity; l != nil {
		id := &Identity{Name: l.Name(), Expiry: l.Expiry()}
		if c := l.Certificate(); c != nil && c.Leaf != nil {
			id.Issuer = c.Leaf.Issuer.String()
		}
		s.Identity = id
	}
	if d.dst != nil {
		st := d.dst.Stats()
		s.Control = &Control{Addr: d.dstAddr, ProfileWatches: st.ProfileWatches, EndpointWatches: st.EndpointWatches,
			PolicyWatches: st.PolicyWatches, InboundWatches: st.InboundWatches, RejectedWatches: st.RejectedWatches}
	}
	return s
}

func (d *Dashboard) stateJSON(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(d.State())
}
