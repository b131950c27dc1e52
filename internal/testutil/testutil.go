// Package testutil holds test helpers shared by inmesh's packages: real
// HTTP/1 and h2c servers and clients on loopback, and metric scraping with
// the OpenTelemetry SDK, rendered as the Prometheus exporter names the
// series. Only tests import it.
package testutil

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
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

// Metrics is an SDK meter provider whose series [Metrics.Scrape] renders in
// the Prometheus text format, named as the OpenTelemetry Prometheus
// exporter names them under inmesh's configuration (no unit or _total
// suffixes added, characters outside [a-zA-Z0-9_:] escaped to '_',
// histograms as cumulative _bucket, _sum and _count), so that tests read
// the series Linkerd's dashboards query. The library's module keeps no
// dependency on the exporter; the examples module scrapes through the real
// one.
type Metrics struct {
	Provider *sdkmetric.MeterProvider
	reader   *sdkmetric.ManualReader
}

// NewMetrics returns a provider whose series [Metrics.Scrape] returns.
func NewMetrics(t testing.TB) *Metrics {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	return &Metrics{Provider: mp, reader: reader}
}

// Scrape returns the Prometheus text exposition of every series.
func (m *Metrics) Scrape(t testing.TB) string {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, m.reader.Collect(context.Background(), &rm))
	var b strings.Builder
	for _, sm := range rm.ScopeMetrics {
		for _, mt := range sm.Metrics {
			name := promName(mt.Name)
			if mt.Description != "" {
				fmt.Fprintf(&b, "# HELP %s %s\n", name, helpEscaper.Replace(mt.Description))
			}
			switch d := mt.Data.(type) {
			case metricdata.Sum[int64]:
				writeType(&b, name, d.IsMonotonic)
				for _, dp := range d.DataPoints {
					writeSample(&b, name, dp.Attributes, "", strconv.FormatInt(dp.Value, 10))
				}
			case metricdata.Sum[float64]:
				writeType(&b, name, d.IsMonotonic)
				for _, dp := range d.DataPoints {
					writeSample(&b, name, dp.Attributes, "", formatFloat(dp.Value))
				}
			case metricdata.Gauge[int64]:
				fmt.Fprintf(&b, "# TYPE %s gauge\n", name)
				for _, dp := range d.DataPoints {
					writeSample(&b, name, dp.Attributes, "", strconv.FormatInt(dp.Value, 10))
				}
			case metricdata.Gauge[float64]:
				fmt.Fprintf(&b, "# TYPE %s gauge\n", name)
				for _, dp := range d.DataPoints {
					writeSample(&b, name, dp.Attributes, "", formatFloat(dp.Value))
				}
			case metricdata.Histogram[float64]:
				fmt.Fprintf(&b, "# TYPE %s histogram\n", name)
				for _, dp := range d.DataPoints {
					var cum uint64
					for i, bound := range dp.Bounds {
						cum += dp.BucketCounts[i]
						writeSample(&b, name+"_bucket", dp.Attributes, formatFloat(bound), strconv.FormatUint(cum, 10))
					}
					writeSample(&b, name+"_bucket", dp.Attributes, "+Inf", strconv.FormatUint(dp.Count, 10))
					writeSample(&b, name+"_sum", dp.Attributes, "", formatFloat(dp.Sum))
					writeSample(&b, name+"_count", dp.Attributes, "", strconv.FormatUint(dp.Count, 10))
				}
			}
		}
	}
	return b.String()
}

func writeType(b *strings.Builder, name string, monotonic bool) {
	kind := "gauge"
	if monotonic {
		kind = "counter"
	}
	fmt.Fprintf(b, "# TYPE %s %s\n", name, kind)
}

// writeSample writes one line: name, the labels sorted by name with le
// last, the value.
func writeSample(b *strings.Builder, name string, attrs attribute.Set, le, value string) {
	type label struct{ k, v string }
	labels := make([]label, 0, attrs.Len()+1)
	for _, kv := range attrs.ToSlice() {
		labels = append(labels, label{promName(string(kv.Key)), kv.Value.String()})
	}
	sort.Slice(labels, func(i, j int) bool { return labels[i].k < labels[j].k })
	if le != "" {
		labels = append(labels, label{"le", le}) // last, as the exposition format writes it
	}
	b.WriteString(name)
	if len(labels) > 0 {
		b.WriteByte('{')
		for i, l := range labels {
			if i > 0 {
				b.WriteByte(',')
			}
			b.WriteString(l.k)
			b.WriteString(`="`)
			b.WriteString(labelEscaper.Replace(l.v))
			b.WriteByte('"')
		}
		b.WriteByte('}')
	}
	b.WriteByte(' ')
	b.WriteString(value)
	b.WriteByte('\n')
}

var helpEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`)

var labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)

// promName escapes what a Prometheus name may not hold to '_'.
func promName(s string) string {
	return strings.Map(func(r rune) rune {
		if r == '_' || r == ':' || 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' {
			return r
		}
		return '_'
	}, s)
}

// formatFloat formats as the Prometheus text format does.
func formatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return "+Inf"
	case math.IsInf(f, -1):
		return "-Inf"
	}
	return strconv.FormatFloat(f, 'g', -1, 64)
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

// Recv receives from ch within [Timeout], and fails the test, naming
// what it waited for, if nothing comes.
func Recv[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(Timeout):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}
