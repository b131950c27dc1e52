package identity_test

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inmesh/inmesh/identity"
	"github.com/inmesh/inmesh/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// config returns the bootstrap configuration of name with token, against
// m's Identity service.
func (m *mesh) config(t *testing.T, name, token string) identity.Config {
	return identity.Config{Name: name, TrustAnchors: m.rootPEM, TokenFile: m.tokenFile(t, token), Addr: m.addr, ServerName: svcName}
}

// expiryGauge returns control_identity_cert_expiration_timestamp_seconds,
// and whether it was reported.
func expiryGauge(t *testing.T, reader *sdkmetric.ManualReader) (float64, bool) {
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			if g, ok := mt.Data.(metricdata.Gauge[float64]); ok && mt.Name == "control_identity_cert_expiration_timestamp_seconds" && len(g.DataPoints) == 1 {
				return g.DataPoints[0].Value, true
			}
		}
	}
	return 0, false
}

// Start returns a certified identity in one call: the certificate carries
// the name and chains to the anchors from the PEM given, the expiry gauge
// is reported from the first certificate on (not only once the first
// renewal comes), the certificate is renewed on schedule (here the
// maximum refresh interval, 100ms), and Close stops the renewals (the
// package's goleak check finds no goroutine left).
func TestStartCertifiesAndRenews(t *testing.T) {
	m := newMesh(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s, err := identity.Start(ctx, m.config(t, books, booksTok), identity.WithLogger(quiet), identity.WithMeterProvider(mp),
		identity.WithRefreshBounds(50*time.Millisecond, 100*time.Millisecond))
	require.NoError(t, err)
	l := s.Local()
	select {
	case <-l.Ready():
	default:
		t.Fatal("Start returned before the identity was ready")
	}
	crt := l.Certificate()
	require.NotNil(t, crt)
	assert.Equal(t, []string{books}, crt.Leaf.DNSNames)
	assert.Equal(t, 1, int(counted(t, reader, "ok")), "one certification, not two")
	got, ok := expiryGauge(t, reader)
	assert.True(t, ok, "the expiry gauge is reported from the first certificate on")
	assert.InDelta(t, float64(l.Expiry().Unix()), got, 1)

	first := crt.Leaf.SerialNumber.String()
	require.Eventually(t, func() bool { return l.Certificate().Leaf.SerialNumber.String() != first }, timeout, 5*time.Millisecond,
		"renewed")
	require.NoError(t, s.Close())
	renewals := counted(t, reader, "ok")
	assert.NoError(t, s.Close(), "a second Close")
	select {
	case <-time.After(300 * time.Millisecond): // three refresh intervals
	case <-ctx.Done():
	}
	assert.Equal(t, renewals, counted(t, reader, "ok"), "no renewal after Close")
	assert.NotNil(t, l.Certificate(), "the certificate stays after Close")
}

// A first certification that fails is logged, naming the identity, and
// tried again from the backoff's start (100ms), not after the minimum
// refresh interval (10s): a token that appears a moment after start (a
// projected token not mounted yet) makes the identity ready within a
// second.
func TestStartRetriesTheFirstCertificationAtOnce(t *testing.T) {
	m := newMesh(t)
	cfg := m.config(t, books, booksTok)
	cfg.TokenFile = filepath.Join(t.TempDir(), "token") // not there yet
	logs := &testutil.LogLines{}
	s, err := identity.NewSession(cfg, identity.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	require.NoError(t, err)
	defer s.Close()
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "certification failed") }, timeout, 5*time.Millisecond)
	assert.Contains(t, logs.String(), books)
	assert.Contains(t, logs.String(), cfg.TokenFile, "the failure names the token file")
	require.NoError(t, os.WriteFile(cfg.TokenFile, []byte(booksTok), 0o600))
	written := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	require.NoError(t, s.Wait(ctx))
	took := time.Since(written)
	t.Logf("certified %v after the token was written", took.Round(time.Millisecond))
	assert.Less(t, took, identity.DefaultMinRefresh/2, "tried again long before the minimum refresh interval")
}

// A refusal by the Identity service (here a token of another service
// account) ends Start's wait at once, with the service's answer, rather
// than at the context's end; a failure that may pass (here a token file
// not there yet) is tried again until the context ends, and then named.
func TestStartNamesTheFailure(t *testing.T) {
	m := newMesh(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	began := time.Now()
	s, err := identity.Start(ctx, m.config(t, books, "authors-token"), identity.WithLogger(quiet))
	require.Error(t, err)
	assert.Nil(t, s)
	assert.Less(t, time.Since(began), 5*time.Second, "a refusal ends the wait at once")
	assert.Equal(t, codes.FailedPrecondition, status.Code(err), "%v", err)
	for _, want := range []string{books, m.addr, "refused", "requested identity did not match provided token"} {
		assert.Contains(t, err.Error(), want)
	}

	short, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	cfg := m.config(t, books, booksTok)
	cfg.TokenFile = filepath.Join(t.TempDir(), "not-yet")
	_, err = identity.Start(short, cfg, identity.WithLogger(quiet))
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	for _, want := range []string{books, m.addr, "last failure", cfg.TokenFile} {
		assert.Contains(t, err.Error(), want)
	}
}

// A configuration that cannot work is refused at once, by its field.
func TestStartRefusesABadConfig(t *testing.T) {
	m := newMesh(t)
	dir := t.TempDir()
	anchorsFile := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(anchorsFile, m.rootPEM, 0o644))
	garbage := filepath.Join(dir, "garbage.crt")
	require.NoError(t, os.WriteFile(garbage, []byte("not PEM\n"), 0o644))
	good := m.config(t, books, booksTok)
	for _, tc := range []struct {
		name   string
		change func(*identity.Config)
		want   []string
	}{
		{"no name", func(c *identity.Config) { c.Name = "" }, []string{"Config.Name"}},
		{"a name that is no identity", func(c *identity.Config) { c.Name = "Books.default." }, []string{"Config.Name", "Books.default."}},
		{"no anchors", func(c *identity.Config) { c.TrustAnchors = nil }, []string{"Config.TrustAnchors or Config.TrustAnchorsFile"}},
		{"both anchors", func(c *identity.Config) { c.TrustAnchorsFile = anchorsFile }, []string{"both set"}},
		{"anchors file missing", func(c *identity.Config) { c.TrustAnchors, c.TrustAnchorsFile = nil, filepath.Join(dir, "nope.crt") },
			[]string{"Config.TrustAnchorsFile", "nope.crt"}},
		{"anchors file not PEM", func(c *identity.Config) { c.TrustAnchors, c.TrustAnchorsFile = nil, garbage },
			[]string{"Config.TrustAnchorsFile", garbage}},
		{"anchors not PEM", func(c *identity.Config) { c.TrustAnchors = []byte("junk") }, []string{"Config.TrustAnchors"}},
		{"no token file", func(c *identity.Config) { c.TokenFile = "" }, []string{"Config.TokenFile"}},
		{"no address", func(c *identity.Config) { c.Addr = "" }, []string{"Config.Addr"}},
		{"a server name that is no identity", func(c *identity.Config) { c.ServerName = "linkerd identity" }, []string{"Config.ServerName"}},
	} {
		cfg := good
		tc.change(&cfg)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		began := time.Now()
		_, err := identity.Start(ctx, cfg, identity.WithLogger(quiet))
		cancel()
		if assert.Error(t, err, tc.name) {
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w, tc.name)
			}
		}
		assert.Less(t, time.Since(began), 5*time.Second, "%s: refused at once", tc.name)
	}

	// The anchors from a file, and the default server name, work.
	cfg := good
	cfg.TrustAnchors, cfg.TrustAnchorsFile, cfg.ServerName = nil, anchorsFile, ""
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	s, err := identity.Start(ctx, cfg, identity.WithLogger(quiet))
	require.NoError(t, err)
	assert.NoError(t, s.Close())
}

// Wait on a closed session returns at once with an error.
func TestSessionWaitAfterClose(t *testing.T) {
	m := newMesh(t)
	cfg := m.config(t, books, booksTok)
	cfg.TokenFile = filepath.Join(t.TempDir(), "never")
	s, err := identity.NewSession(cfg, identity.WithLogger(quiet))
	require.NoError(t, err)
	require.NoError(t, s.Close())
	err = s.Wait(context.Background())
	assert.ErrorContains(t, err, "closed")
	assert.False(t, errors.Is(err, context.Canceled))
}

// Env.Config takes the values Linkerd's proxy injector sets.
func TestEnvConfig(t *testing.T) {
	env, ok, err := identity.EnvFromLookup(func(k string) (string, bool) {
		v, ok := map[string]string{
			identity.EnvLocalName: books, identity.EnvTokenFile: "/var/run/secrets/tokens/linkerd-identity-token",
			identity.EnvTrustAnchors: "PEM", identity.EnvSvcAddr: "linkerd-identity-headless.linkerd.svc.cluster.local.:8080",
			identity.EnvSvcName: svcName,
		}[k]
		return v, ok
	})
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, identity.Config{Name: books, TrustAnchors: []byte("PEM"), TokenFile: "/var/run/secrets/tokens/linkerd-identity-token",
		Addr: "linkerd-identity-headless.linkerd.svc.cluster.local.:8080", ServerName: svcName}, env.Config())
	assert.Equal(t, svcName, identity.DefaultServiceName)
}
