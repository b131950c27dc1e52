package main

import (
	"context"
	"net/http"
)

// peerSet is three ways of sending HTTP/1 requests to a peer: an HTTP/1
// pool, inmesh's upgrade (HTTP/2 with l5d-orig-proto over one h2c
// connection, downgraded by the peer) and Go's own h2c client. Each has
// its own peer, so that each counts its own connections. A fourth peer
// answers Go's h2c with one response header (Content-Type): net/http's
// HTTP/2 server writes a response whose header map is not empty in two
// steps (the handler waits until HEADERS is written, and the connection
// is flushed in between), which the upgraded hop always pays for
// l5d-orig-proto and any real application pays for its own headers.
type peerSet struct {
	h1, up, h2c            http.RoundTripper
	h1S, upS, h2cS, h2cHdr *server
	close                  func()
}

// okTyped is ok with a Content-Type of its own.
var okTyped = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header()["Content-Type"] = []string{"text/plain; charset=utf-8"}
	w.Write([]byte("ok"))
})

func newPeerSet() *peerSet {
	p := &peerSet{
		h1S: serveMeshed(downgrade(ok)), upS: serveMeshed(downgrade(ok)), h2cS: serveMeshed(downgrade(ok)),
		h2cHdr: serveMeshed(downgrade(okTyped)),
	}
	h1, h2c := h1Transport(), h2cTransport()
	up, closeUp := upgraded()
	p.h1, p.up, p.h2c = h1, up, h2c
	p.close = func() {
		h1.CloseIdleConnections()
		h2c.CloseIdleConnections()
		closeUp()
		p.h1S.Close()
		p.upS.Close()
		p.h2cS.Close()
		p.h2cHdr.Close()
	}
	// One request first, so that the HTTP/2 clients open their one
	// connection before 64 goroutines arrive at once.
	_ = do(p.up, get(p.upS.URL+"/", ""))
	_ = do(p.h2c, get(p.h2cS.URL+"/", ""))
	_ = do(p.h2c, get(p.h2cHdr.URL+"/", ""))
	return p
}

func (p *peerSet) variants(m func(rt http.RoundTripper, url string) (figures, error)) []variant {
	mk := func(name string, rt http.RoundTripper, s *server) variant {
		return variant{name, withConns(s, func() (figures, error) { return m(rt, s.URL+"/books/1") })}
	}
	return []variant{mk("http1", p.h1, p.h1S), mk("upgraded", p.up, p.upS), mk("go_h2c", p.h2c, p.h2cS),
		mk("go_h2c_header", p.h2c, p.h2cHdr)}
}

// upgrade64: 64 clients over one upgraded h2 connection against an
// HTTP/1 pool, and against Go's own h2c.
func upgrade64(o options) (*result, error) {
	p := newPeerSet()
	defer p.close()
	n := o.scale(10000, 5000)
	rs, err := interleave(o.rounds, p.variants(func(rt http.RoundTripper, url string) (figures, error) {
		return parallel(rt, func() *http.Request { return get(url, "") }, n, 64, false)
	})...)
	if err != nil {
		return nil, err
	}
	const h1, up, h2c, h2cHdr = 0, 1, 2, 3
	r := &result{
		ratio:     rs.ratio("", atLeast(0.8), func(f []figures) float64 { return f[up].RPS / f[h1].RPS }),
		Candidate: rs.median(up), Baseline: rs.median(h1),
		Others: map[string]figures{"go_h2c": *rs.median(h2c), "go_h2c_header": *rs.median(h2cHdr)},
		Extra: []ratio{
			rs.ratio("go_h2c / http1", noGoal, func(f []figures) float64 { return f[h2c].RPS / f[h1].RPS }),
			rs.ratio("upgraded / go_h2c", atLeast(1), func(f []figures) float64 { return f[up].RPS / f[h2c].RPS }),
			rs.ratio("upgraded / go_h2c_header", noGoal, func(f []figures) float64 { return f[up].RPS / f[h2cHdr].RPS }),
		},
	}
	r.Note = "ratio = requests/s upgraded / HTTP/1 pool (64 clients)"
	return r, nil
}

// upgradeSerial: one request at a time, upgraded against HTTP/1.
func upgradeSerial(o options) (*result, error) {
	p := newPeerSet()
	defer p.close()
	n := o.scale(2000, 1000)
	rs, err := interleave(o.rounds, p.variants(func(rt http.RoundTripper, url string) (figures, error) {
		return serial(rt, func() *http.Request { return get(url, "") }, n)
	})...)
	if err != nil {
		return nil, err
	}
	const h1, up, h2c, h2cHdr = 0, 1, 2, 3
	r := &result{
		ratio:     rs.ratio("", atMost(1.5), func(f []figures) float64 { return f[up].P50 / f[h1].P50 }),
		Candidate: rs.median(up), Baseline: rs.median(h1),
		Others: map[string]figures{"go_h2c": *rs.median(h2c), "go_h2c_header": *rs.median(h2cHdr)},
		Extra: []ratio{
			rs.ratio("go_h2c p50 / http1", noGoal, func(f []figures) float64 { return f[h2c].P50 / f[h1].P50 }),
			rs.ratio("go_h2c_header p50 / http1", noGoal, func(f []figures) float64 { return f[h2cHdr].P50 / f[h1].P50 }),
		},
	}
	r.Note = "ratio = serial p50 upgraded / HTTP/1"
	return r, nil
}

// mesh64: the whole mesh (outbound stack, upgraded hop, inbound stack,
// control plane) with 64 clients, against bare net/http; and two nginx
// hops where nginx is installed.
func mesh64(o options) (*result, error) {
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	m, err := newMeshed(ok, mp)
	if err != nil {
		return nil, err
	}
	defer m.close()
	bare := serve(&http.Server{Handler: ok})
	defer bare.Close()
	rt := h1Transport()
	defer rt.CloseIdleConnections()
	n := o.scale(10000, 5000)
	vs := []variant{
		{"bare", withConns(bare, func() (figures, error) {
			return parallel(rt, func() *http.Request { return get(bare.URL+"/books/1", "") }, n, 64, false)
		})},
		{"mesh", withConns(m.peer, func() (figures, error) {
			return parallel(m.st.client, func() *http.Request { return get("http://"+books+"/books/1", "") }, n, 64, false)
		})},
	}
	note := ""
	if a, err := startNginx(bare.addr()); err != nil {
		note = "two nginx hops skipped: " + err.Error()
	} else {
		defer a.stop()
		if b, err := startNginx(a.addr); err != nil {
			note = "two nginx hops skipped: " + err.Error()
		} else {
			defer b.stop()
			vs = append(vs, variant{"two_nginx_hops", func() (figures, error) {
				return parallel(rt, func() *http.Request { return get("http://"+b.addr+"/books/1", "") }, n, 64, false)
			}})
		}
	}
	rs, err := interleave(o.rounds, vs...)
	if err != nil {
		return nil, err
	}
	r := &result{
		ratio:     rs.ratio("", atLeast(0.7), func(f []figures) float64 { return f[1].RPS / f[0].RPS }),
		Candidate: rs.median(1), Baseline: rs.median(0),
	}
	if len(vs) == 3 {
		r.Others = map[string]figures{"two_nginx_hops": *rs.median(2)}
		r.Extra = []ratio{rs.ratio("two nginx hops / bare", noGoal, func(f []figures) float64 { return f[2].RPS / f[0].RPS })}
	}
	r.Note = "ratio = requests/s through the whole mesh / bare net/http (64 clients); connections = to the peer"
	if note != "" {
		r.Note += "; " + note
	}
	return r, nil
}
