package origproto

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

type benchPeer struct {
	url   string
	conns atomic.Int32
	close func()
}

func newBenchPeer(b *testing.B) *benchPeer {
	p := &benchPeer{}
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	srv := httptest.NewUnstartedServer(nil)
	srv.Config = NewServer(NewHandler(app))
	srv.Config.ConnState = func(c net.Conn, s http.ConnState) {
		if s == http.StateNew {
			p.conns.Add(1)
		}
	}
	srv.Start()
	p.url, p.close = srv.URL, srv.Close
	return p
}

func get(b *testing.B, rt http.RoundTripper, url string) {
	req, _ := http.NewRequest("GET", url, nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// BenchmarkPeerHop compares, round by round in one run, HTTP/1 requests
// sent to a peer over a pool of HTTP/1 connections and upgraded over one
// h2c connection: serially, and from 64 goroutines at once.
func BenchmarkPeerHop(b *testing.B) {
	peer := newBenchPeer(b)
	defer peer.close()
	plain := &http.Transport{MaxIdleConnsPerHost: 64, Protocols: new(http.Protocols)}
	plain.Protocols.SetHTTP1(true)
	defer plain.CloseIdleConnections()
	h2 := NewH2Transport()
	defer h2.CloseIdleConnections()
	upgraded := NewTransport(WithH2(h2), WithHint(func(*http.Request) bool { return true }))
	variants := []struct {
		name string
		rt   http.RoundTripper
	}{{"plain", plain}, {"upgraded", upgraded}}
	for round := range 6 {
		for _, v := range variants {
			b.Run(fmt.Sprintf("round%d/serial/%s", round, v.name), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					get(b, v.rt, peer.url)
				}
			})
			b.Run(fmt.Sprintf("round%d/64clients/%s", round, v.name), func(b *testing.B) {
				b.ReportAllocs()
				b.SetParallelism(32) // 64 goroutines on 2 CPUs
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						get(b, v.rt, peer.url)
					}
				})
			})
		}
	}
	b.Logf("connections to the peer over the whole run: %d", peer.conns.Load())
}

// BenchmarkLayers measures the upgrade and downgrade translation alone,
// in process: the allocations the two layers add per request.
func BenchmarkLayers(b *testing.B) {
	app := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })
	down := NewHandler(app)
	// The upgrade side's HTTP/2 hop is replaced by a call to the downgrade
	// handler with the upgraded request, so that only the two translations
	// are measured.
	hop := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		r.RemoteAddr = "127.0.0.1:4143"
		w := httptest.NewRecorder()
		down.ServeHTTP(w, r)
		return w.Result(), nil
	})
	up := NewTransport(WithH2(hop), WithHint(func(*http.Request) bool { return true }))
	direct := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		w := httptest.NewRecorder()
		app.ServeHTTP(w, r)
		return w.Result(), nil
	})
	req, _ := http.NewRequest("GET", "http://books.default.svc.cluster.local:7000/books/1", nil)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("Connection", "keep-alive")
	for _, v := range []struct {
		name string
		rt   http.RoundTripper
	}{{"direct", direct}, {"upgrade+downgrade", up}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				resp, _ := v.rt.RoundTrip(req)
				resp.Body.Close()
			}
		})
	}
}
