package classify

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/inmesh/inmesh/internal/metrics"
	"github.com/inmesh/inmesh/internal/testutil"
)

// BenchmarkOutboundBytesPerName reports the live heap that the outbound
// request metrics of one name take (bytes/name): a target with a
// balancer's endpoint labels (dst_*, target_*, tls), one request and one
// response recorded, as a client holds for each of thousands of Services.
// The endpoint labels themselves are counted, as the balancer keeps them
// anyway.
func BenchmarkOutboundBytesPerName(b *testing.B) {
	const names = 2000
	m := testutil.NewMetrics(b)
	addr := netip.MustParseAddrPort("127.0.0.1:8080")
	for b.Loop() {
		b.StopTimer()
		before := liveHeap()
		rec := newRecorder(newConfig([]Option{WithMeterProvider(m.Provider), WithMaxAuthorities(names)}), "outbound")
		b.StartTimer()
		labels := make([]*Labels, names)
		for i := range names {
			svc := fmt.Sprintf("svc-%d", i)
			kv := map[string]string{"dst_namespace": "table", "dst_service": svc, "tls": "disabled"}
			for _, t := range metrics.TargetLabels(addr) {
				kv[string(t.Key)] = t.Value.AsString()
			}
			authority := svc + ".table.svc.cluster.local:80"
			labels[i] = NewLabels("", kv).ForAuthority(authority)
			tg := rec.target(authority, labels[i])
			tg.Request(b.Context())
			tg.Response(b.Context(), metrics.Response{Status: 204, GRPC: -1}, time.Now())
		}
		b.StopTimer()
		b.ReportMetric(float64(liveHeap()-before)/names, "bytes/name")
		runtime.KeepAlive(labels)
		runtime.KeepAlive(rec)
		b.StartTimer()
	}
}

// liveHeap is the heap in use after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
