// Package testutil holds test helpers shared by inmesh's packages: real
// HTTP/1 and h2c servers and clients on loopback, and metric scraping with
// the OpenTelemetry SDK and its Prometheus exporter. Only tests import it.
package testutil

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/otlptranslator"
	"github.com/stretchr/testify/require"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

const (
	// Timeout bounds waits for what must happen.
	Timeout = 10 * time.Second
	// ShortTimeout is how long a test watches for what must not happen.
	ShortTimeout = 300 * time.Millisecond
)

// Mode is the protocol between a test client and server.
type Mode string

// The modes every client/server test runs in.
const (
	H1  Mode = "h1"
	H2C Mode = "h2c"
)

// Run runs f once per mode, as subtests.
func Run(t *testing.T, f func(t *testing.T, mode Mode)) {
	for _, m := range []Mode{H1, H2C} {
		t.Run(string(m), func(t *testing.T) { f(t, m) })
	}
}

// NewServer starts a loopback server for h that speaks HTTP/1.1 and h2c
// (prior knowledge) on one port. It is closed at the end of the test.
func NewServer(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// NewTransport returns a client transport speaking mode, closed at the end
// of the test.
func NewTransport(t testing.TB, mode Mode) *http.Transport {
	t.Helper()
	tr := &http.Transport{Protocols: new(http.Protocols), ForceAttemptHTTP2: mode == H2C}
	if mode == H2C {
		tr.Protocols.SetUnencryptedHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// Metrics is an SDK meter provider read through the Prometheus exporter,
// configured so that the series are named exactly as Linkerd names them.
type Metrics struct {
	Provider *sdkmetric.MeterProvider
	registry *prometheus.Registry
}

// NewMetrics returns a provider whose series [Metrics.Scrape] returns.
func NewMetrics(t testing.TB) *Metrics {
	t.Helper()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		otelprom.WithoutScopeInfo(),
		otelprom.WithoutTargetInfo(),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithoutSuffixes),
	)
	require.NoError(t, err)
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &Metrics{Provider: mp, registry: reg}
}

// Scrape returns the Prometheus text exposition of every series.
func (m *Metrics) Scrape(t testing.TB) string {
	t.Helper()
	families, err := m.registry.Gather()
	require.NoError(t, err)
	var b bytes.Buffer
	for _, f := range families {
		_, err := expfmt.MetricFamilyToText(&b, f)
		require.NoError(t, err)
	}
	return b.String()
}

// Lines returns the scraped lines that start with prefix and contain every
// one of the label pairs (such as `rt_route="x"`).
func (m *Metrics) Lines(t testing.TB, prefix string, labels ...string) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(m.Scrape(t), "\n") {
		if !strings.HasPrefix(line, prefix+"{") && !strings.HasPrefix(line, prefix+" ") {
			continue
		}
		ok := true
		for _, l := range labels {
			ok = ok && strings.Contains(line, l)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}

// Value returns the value of the single series line matching prefix and
// labels, or "" when there is none.
func (m *Metrics) Value(t testing.TB, prefix string, labels ...string) string {
	t.Helper()
	lines := m.Lines(t, prefix, labels...)
	if len(lines) == 0 {
		return ""
	}
	require.Len(t, lines, 1, "more than one series: %v", lines)
	return lines[0][strings.LastIndexByte(lines[0], ' ')+1:]
}

// FreeAddr returns a loopback address nothing listens on now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}
