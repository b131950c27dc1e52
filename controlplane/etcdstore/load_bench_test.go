package etcdstore

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/inmesh/inmesh/controlplane"
	"github.com/inmesh/inmesh/internal/ratelog"
)

// BenchmarkLoadOneChange measures what the watch does with one changed
// key when etcd holds the endpoints key of each of 2,000 Services and
// three registrations of each: one endpoints key rewritten, and one
// registration added then removed.
func BenchmarkLoadOneChange(b *testing.B) {
	const n = 2000
	w := &watcher{store: controlplane.NewStore(), prefix: "/inmesh/", log: ratelog.New(slog.New(slog.DiscardHandler), 0),
		manifests: map[string][]byte{}, endpoints: map[string][]byte{}, registrations: map[string][]byte{}}
	set := func(i, port int) []byte {
		return fmt.Appendf(nil, "- authority: svc-%d.default.svc.cluster.local:8080\n  endpoints:\n  - addr: 10.1.%d.%d:%d\n  - addr: 10.2.%d.%d:%d\n",
			i, i/250, i%250+1, port, i/250, i%250+1, port)
	}
	reg, err := json.Marshal(registered{Identity: "web.default.serviceaccount.identity.linkerd.cluster.local"})
	if err != nil {
		b.Fatal(err)
	}
	regKey := func(i, k int) string {
		return RegistrationKey("/inmesh", fmt.Sprintf("svc-%d.default.svc.cluster.local:8080", i),
			netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 3, byte(i / 250), byte(i%250 + 1)}), uint16(9000+k)), 0x10)
	}
	for i := range n {
		w.put(EndpointsKey("/inmesh", fmt.Sprintf("svc-%d", i)), set(i, 8080))
		for k := range 3 {
			w.put(regKey(i, k), reg)
		}
	}
	if err := w.load(); err != nil {
		b.Fatal(err)
	}
	b.Run("an endpoints key", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			w.put(EndpointsKey("/inmesh", "svc-7"), set(7, 8080+i%2))
			if err := w.load(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("a registration", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if i%2 == 1 {
				w.put(regKey(7, 3), reg)
			} else {
				w.delete(regKey(7, 3))
			}
			if err := w.load(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
