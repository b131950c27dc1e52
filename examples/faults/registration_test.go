package faults

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/destination"
	"github.com/inmesh/inmesh/internal/regtest"
	pb "github.com/inmesh/inmesh/proxyapi/destinationpb"
	"github.com/inmesh/inmesh/proxyapi/registrationpb"
	"github.com/inmesh/inmesh/registration"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	xcredentials "google.golang.org/grpc/experimental/credentials"
	"google.golang.org/grpc/status"
)

const (
	regBooks   = "books.default.svc.cluster.local:7000"
	regReviews = "reviews.default.svc.cluster.local:9000"
	regRatings = "ratings.default.svc.cluster.local:9100"
	ratingsID  = "ratings.default.serviceaccount.identity.linkerd.cluster.local"
)

// regManifests are regtest's (books:7000 bound to books' service account,
// reviews:9000 to web's identity by annotation) and ratings:9100, bound to
// ratings' identity by annotation: the legitimate registrant of the
// floods, whose identity no flood uses.
const regManifests = regtest.Manifests + `---
apiVersion: v1
kind: Service
metadata:
  name: ratings
  namespace: default
  annotations: {inmesh.io/registration-identities: "` + ratingsID + `"}
spec: {ports: [{name: http, port: 9100}]}
`

// refusedBy returns registration_refused_total's value for reason.
func refusedBy(t *testing.T, r *sdkmetric.ManualReader, reason string) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	var sum int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if d, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "registration_refused_total" {
				for _, p := range d.DataPoints {
					if v, ok := p.Attributes.Value(attribute.Key("reason")); ok && v.AsString() == reason {
						sum += p.Value
					}
				}
			}
		}
	}
	return sum
}

// regAnswers follows the endpoints of authorities on a control plane's
// Destination API (plaintext addr): every address ever added, with the
// identity it carried, and the addresses served now.
type regAnswers struct {
	mu    sync.Mutex
	added map[string]string // address -> identity, every one ever added
	now   map[string]bool
}

func watchRegistered(t *testing.T, addr string, authorities ...string) *regAnswers {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	a := &regAnswers{added: map[string]string{}, now: map[string]bool{}}
	var wg sync.WaitGroup
	for _, authority := range authorities {
		st, err := pb.NewDestinationClient(conn).Get(ctx, &pb.GetDestination{Path: authority})
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				up, err := st.Recv()
				if err != nil {
					return
				}
				a.mu.Lock()
				for _, w := range up.GetAdd().GetAddrs() {
					ap, _ := destination.AddrFromProto(w.GetAddr())
					key := authority + " " + ap.String()
					a.added[key] = w.GetTlsIdentity().GetDnsLikeIdentity().GetName()
					a.now[key] = true
				}
				for _, r := range up.GetRemove().GetAddrs() {
					ap, _ := destination.AddrFromProto(r)
					delete(a.now, authority+" "+ap.String())
				}
				a.mu.Unlock()
			}
		}()
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		conn.Close()
	})
	return a
}

// served reports how many addresses of authority are served now.
func (a *regAnswers) served(authority string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for k := range a.now {
		if len(k) > len(authority) && k[:len(authority)+1] == authority+" " {
			n++
		}
	}
	return n
}

func (a *regAnswers) has(authority, addr string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.now[authority+" "+addr]
}

func (a *regAnswers) ever() map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make(map[string]string, len(a.added))
	for k, v := range a.added {
		out[k] = v
	}
	return out
}

// regAttempt opens a registration stream on conn, sends eps and waits for
// the answer: nil when accepted (the stream then stays open until its
// cancel is called), else the refusal.
func regAttempt(conn grpc.ClientConnInterface, eps []*registrationpb.Endpoint) (context.CancelFunc, error) {
	// The answer is awaited for a bounded time; an accepted stream then
	// stays open, however long, until its cancel.
	ctx, cancel := context.WithCancel(context.Background())
	bound := time.AfterFunc(2*timeout, cancel)
	st, err := registrationpb.NewRegistrationClient(conn).Register(ctx)
	if err == nil {
		err = st.Send(&registrationpb.RegisterRequest{Kind: &registrationpb.RegisterRequest_Endpoints{
			Endpoints: &registrationpb.Endpoints{Endpoints: eps}}})
		if errors.Is(err, io.EOF) {
			err = nil // the server ended the stream already: Recv has why
		}
	}
	if err == nil {
		var resp *registrationpb.RegisterResponse
		if resp, err = st.Recv(); err == nil && resp.GetAccepted() == nil {
			err = fmt.Errorf("answered %v", resp)
		}
	}
	if !bound.Stop() && err == nil {
		err = errors.New("no answer within the bound")
	}
	if err != nil {
		cancel()
		return nil, err
	}
	return cancel, nil
}

func regEndpoint(authority string, port int, id string) *registrationpb.Endpoint {
	return &registrationpb.Endpoint{Authority: authority, Addr: fmt.Sprintf("127.0.0.1:%d", port), Identity: id,
		Protocol: registrationpb.ProtocolHint_PROTOCOL_HINT_H2}
}

// legitimate registers ratings' endpoint through the registration package
// again and again until stop, each time waiting for it to be accepted and
// served, then deregistering it; it returns how many went through and the
// failures.
func legitimate(t *testing.T, conn grpc.ClientConnInterface, answers *regAnswers, stop <-chan struct{}) (wait func() (int, []string)) {
	var done int
	var failures []string
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			addr := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.2"), uint16(20000+i%1000))
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			r, err := registration.Register(ctx, conn, []registration.Endpoint{{Authority: regRatings, Addr: addr, H2: true}},
				registration.WithLogger(quiet))
			if err == nil {
				select {
				case <-r.Accepted():
					deadline := time.Now().Add(timeout)
					for !answers.has(regRatings, addr.String()) && time.Now().Before(deadline) {
						time.Sleep(time.Millisecond)
					}
					if !answers.has(regRatings, addr.String()) {
						err = fmt.Errorf("%s accepted but never served", addr)
					}
				case <-ctx.Done():
					err = fmt.Errorf("%s not accepted: %v", addr, r.Err())
				}
				if derr := r.Deregister(ctx); err == nil && derr != nil {
					err = derr
				}
			}
			cancel()
			if err != nil {
				if len(failures) < 5 {
					failures = append(failures, err.Error())
				}
				continue
			}
			done++
		}
	}()
	return func() (int, []string) {
		<-finished
		return done, failures
	}
}

// A flood of registrants at a control plane serving the Registration API
// over mTLS (regtest's, with the default limits: 64 endpoints a stream, 16
// streams an identity): books opens stream after stream, each holding one
// endpoint, up to and past the 16 it may hold; web sends 65 endpoints at
// once, plaintext callers register without an identity; meanwhile ratings
// registers through the registration package, is served and deregisters,
// again and again. Exactly 16 of books' streams are accepted and served;
// every other is refused with ResourceExhausted, web's with
// ResourceExhausted, the plaintext ones with PermissionDenied, each
// counted under its reason (limit, plaintext); every one of ratings'
// registrations goes through. The process's goroutines and heap stay
// bounded during the flood and, once books' held streams end, return to
// their baseline, and books' endpoints leave the answers.
func TestRegistrationFlood(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	c := regtest.Start(t, regManifests, controlplane.WithMeterProvider(mp), controlplane.WithLogger(quiet))
	booksConn, webConn, ratingsConn := c.Dial(t, c.Certify(t, booksID)), c.Dial(t, c.Certify(t, webID)), c.Dial(t, c.Certify(t, ratingsID))
	plainConn := c.Dial(t, nil)
	answers := watchRegistered(t, c.Addr, regBooks, regReviews, regRatings)

	// Warm every path (a TLS connection per identity), then the baseline.
	cancel, err := regAttempt(booksConn, []*registrationpb.Endpoint{regEndpoint(regBooks, 1, "")})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return answers.served(regBooks) == 1 }, timeout, time.Millisecond)
	cancel()
	require.Eventually(t, func() bool { return answers.served(regBooks) == 0 }, timeout, time.Millisecond)
	var big []*registrationpb.Endpoint
	for i := range controlplane.DefaultMaxRegisteredEndpoints + 1 {
		big = append(big, regEndpoint(regReviews, 30000+i, ""))
	}
	_, err = regAttempt(webConn, big)
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	_, err = regAttempt(plainConn, []*registrationpb.Endpoint{regEndpoint(regBooks, 2, "")})
	require.Equal(t, codes.PermissionDenied, status.Code(err), "%v", err)
	limitBefore, plainBefore := refusedBy(t, reader, controlplane.RefusedLimit), refusedBy(t, reader, controlplane.RefusedPlaintext)
	base := measure()
	t.Logf("baseline: %v", base)

	n := size(5000, 300) // registrants of each kind
	stop := make(chan struct{})
	legit := legitimate(t, ratingsConn, answers, stop)

	var mu sync.Mutex
	var held []context.CancelFunc
	codesBy := map[string]map[codes.Code]int{"books": {}, "web": {}, "plaintext": {}}
	kinds := []struct {
		name string
		do   func(i int) (context.CancelFunc, error)
	}{
		{"books", func(i int) (context.CancelFunc, error) {
			return regAttempt(booksConn, []*registrationpb.Endpoint{regEndpoint(regBooks, 10000+i, "")})
		}},
		{"web", func(int) (context.CancelFunc, error) { return regAttempt(webConn, big) }},
		{"plaintext", func(i int) (context.CancelFunc, error) {
			return regAttempt(plainConn, []*registrationpb.Endpoint{regEndpoint(regBooks, 40000+i%20000, "")})
		}},
	}
	var peak atomic.Int64
	sample := func() {
		if g := int64(measure().goroutines); g > peak.Load() {
			peak.Store(g)
		}
	}
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				k := kinds[j%len(kinds)]
				cancel, err := k.do(j / len(kinds))
				mu.Lock()
				codesBy[k.name][status.Code(err)]++
				if cancel != nil {
					held = append(held, cancel)
				}
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	for j := range n * len(kinds) {
		if j%500 == 0 {
			sample()
		}
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	sample()
	close(stop)
	legitDone, legitFailures := legit()
	during := measure()
	t.Logf("%d registrants of each of %d kinds in %v: %v; ratings registered, served and deregistered %d times during the flood; peak %d goroutines; right after: %v",
		n, len(kinds), time.Since(start).Round(time.Millisecond), codesBy, legitDone, peak.Load(), during)

	assert.Equal(t, map[codes.Code]int{codes.OK: controlplane.DefaultMaxRegistrationsPerIdentity, codes.ResourceExhausted: n - controlplane.DefaultMaxRegistrationsPerIdentity},
		codesBy["books"], "books: 16 streams held, the rest refused")
	assert.Equal(t, map[codes.Code]int{codes.ResourceExhausted: n}, codesBy["web"], "65 endpoints in a stream")
	assert.Equal(t, map[codes.Code]int{codes.PermissionDenied: n}, codesBy["plaintext"])
	assert.Equal(t, int64(2*n-controlplane.DefaultMaxRegistrationsPerIdentity), refusedBy(t, reader, controlplane.RefusedLimit)-limitBefore, "refused for a limit")
	assert.Equal(t, int64(n), refusedBy(t, reader, controlplane.RefusedPlaintext)-plainBefore, "refused for plaintext")
	assert.Positive(t, legitDone, "ratings never registered during the flood")
	assert.Empty(t, legitFailures, "ratings' registrations failed during the flood")
	assert.Equal(t, controlplane.DefaultMaxRegistrationsPerIdentity, answers.served(regBooks), "books' held endpoints are served")
	assert.Zero(t, answers.served(regReviews), "none of web's refused endpoints is served")
	// Bounded while the streams are held: a few goroutines per held
	// stream and per worker, nothing per refused registrant.
	assert.LessOrEqual(t, int(peak.Load()), base.goroutines+400, "goroutines during the flood")

	mu.Lock()
	for _, cancel := range held {
		cancel()
	}
	mu.Unlock()
	require.Eventually(t, func() bool { return answers.served(regBooks) == 0 }, timeout, 10*time.Millisecond, "books' endpoints left the answers")
	backToBaseline(t, base, 10, 16, nil)
}

// Registrations that claim what the caller is not, refused whether alone
// or in a flood: an endpoint carrying another identity than the caller's
// (books claiming web), a Service the caller is not bound to (web
// registering books:7000; books registering reviews:9000), a port the
// Service does not define, and a client certificate from another trust
// root (the handshake itself is refused: the client sees Unavailable, and
// the Registration API never hears of it). Each is refused with
// PermissionDenied (the forged certificate, at the handshake), counted
// under its reason (identity, service), and no address they named ever
// appears in the Destination API's answers, while a legitimate
// registration of books, after the flood, does (so the check can fail).
func TestForgedRegistrations(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	c := regtest.Start(t, regManifests, controlplane.WithMeterProvider(mp), controlplane.WithLogger(quiet))
	booksLocal := c.Certify(t, booksID)
	booksConn, webConn := c.Dial(t, booksLocal), c.Dial(t, c.Certify(t, webID))
	answers := watchRegistered(t, c.Addr, regBooks, regReviews)

	// books' identity under another trust root: its certificate is
	// presented to the real control plane, whose certificate the client
	// does not check (so that the server's refusal is what is seen).
	foreign := newPKI(t).local(t, booksID)
	cfg := foreign.ClientConfig(c.Name)
	cfg.VerifyConnection = nil
	foreignConn, err := grpc.NewClient("passthrough:///"+c.TLSAddr, grpc.WithTransportCredentials(xcredentials.NewTLSWithALPNDisabled(cfg)))
	require.NoError(t, err)
	t.Cleanup(func() { foreignConn.Close() })

	kinds := []struct {
		name   string
		conn   grpc.ClientConnInterface
		eps    func(i int) []*registrationpb.Endpoint
		code   codes.Code
		reason string
	}{
		{"books claims web's identity", booksConn, func(i int) []*registrationpb.Endpoint {
			return []*registrationpb.Endpoint{regEndpoint(regBooks, 10000+i, webID)}
		}, codes.PermissionDenied, controlplane.RefusedIdentity},
		{"books's endpoint then one claiming web", booksConn, func(i int) []*registrationpb.Endpoint {
			return []*registrationpb.Endpoint{regEndpoint(regBooks, 20000+i, ""), regEndpoint(regBooks, 30000+i, webID)}
		}, codes.PermissionDenied, controlplane.RefusedIdentity},
		{"web registers books", webConn, func(i int) []*registrationpb.Endpoint {
			return []*registrationpb.Endpoint{regEndpoint(regBooks, 40000+i, "")}
		}, codes.PermissionDenied, controlplane.RefusedService},
		{"books registers reviews", booksConn, func(i int) []*registrationpb.Endpoint {
			return []*registrationpb.Endpoint{regEndpoint(regReviews, 10000+i, "")}
		}, codes.PermissionDenied, controlplane.RefusedService},
		{"books registers a port books does not define", booksConn, func(i int) []*registrationpb.Endpoint {
			return []*registrationpb.Endpoint{regEndpoint("books.default.svc.cluster.local:7001", 10000+i, "")}
		}, codes.PermissionDenied, controlplane.RefusedService},
		{"a certificate of another trust root", foreignConn, func(i int) []*registrationpb.Endpoint {
			return []*registrationpb.Endpoint{regEndpoint(regBooks, 50000+i, "")}
		}, codes.Unavailable, ""},
	}
	reasons := []string{controlplane.RefusedIdentity, controlplane.RefusedService, controlplane.RefusedPlaintext,
		controlplane.RefusedInvalid, controlplane.RefusedLimit}
	counts := func() map[string]int64 {
		m := map[string]int64{}
		for _, r := range reasons {
			m[r] = refusedBy(t, reader, r)
		}
		return m
	}

	// Each alone, with its words.
	for _, k := range kinds {
		_, err := regAttempt(k.conn, k.eps(0))
		require.Equal(t, k.code, status.Code(err), "%s: %v", k.name, err)
		t.Logf("%s: %v", k.name, err)
	}
	before := counts()

	// Then in a flood, from 16 goroutines.
	n := size(5000, 200) // of each kind
	got := make([]map[codes.Code]int, len(kinds))
	for i := range got {
		got[i] = map[codes.Code]int{}
	}
	var mu sync.Mutex
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range jobs {
				k := j % len(kinds)
				cancel, err := regAttempt(kinds[k].conn, kinds[k].eps(1+j/len(kinds)))
				if cancel != nil {
					cancel()
				}
				mu.Lock()
				got[k][status.Code(err)]++
				mu.Unlock()
			}
		}()
	}
	start := time.Now()
	for j := range n * len(kinds) {
		jobs <- j
	}
	close(jobs)
	wg.Wait()
	t.Logf("%d forged registrations of each of %d kinds in %v", n, len(kinds), time.Since(start).Round(time.Millisecond))

	want := map[string]int64{}
	for i, k := range kinds {
		assert.Equal(t, map[codes.Code]int{k.code: n}, got[i], "%s: every one refused", k.name)
		if k.reason != "" {
			want[k.reason] += int64(n)
		}
	}
	after := counts()
	for _, r := range reasons {
		assert.Equal(t, want[r], after[r]-before[r], "registration_refused_total{reason=%q} during the flood", r)
	}

	// A legitimate registration reaches the answers: the watch sees what
	// is registered. Then nothing any forged one named was ever there.
	cancel, err := regAttempt(booksConn, []*registrationpb.Endpoint{regEndpoint(regBooks, 60000, "")})
	require.NoError(t, err)
	defer cancel()
	require.Eventually(t, func() bool { return answers.has(regBooks, "127.0.0.1:60000") }, timeout, time.Millisecond)
	ever := answers.ever()
	assert.Equal(t, map[string]string{regBooks + " 127.0.0.1:60000": booksID}, ever, "the only address ever served is the legitimate one, with its identity")
}
