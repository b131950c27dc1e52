package main

import (
	"context"
	"net/http"
	"net/http/httptest"

	origproto "github.com/inmesh/inmesh/orig-proto"
)

// stackInProcess: the inbound stack served in process (no network), its
// added time per request against otelhttp.NewHandler's, both recording
// into the same SDK.
func stackInProcess(o options) (*result, error) {
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	st := newStack(ok, mp, namedProfile(books), nil, books)
	defer st.close()
	req := httptest.NewRequest("GET", "http://"+books+"/books/123", nil)
	if err := waitRoutes(st.server.Router(), books, func() { st.server.ServeHTTP(httptest.NewRecorder(), req) }); err != nil {
		return nil, err
	}
	n := o.scale(20000, 10000)
	otel := otelHandler(ok, mp)
	measure := func(h http.Handler) func() (figures, error) {
		return func() (figures, error) { return inProcess(h, req, n), nil }
	}
	rs, err := interleave(o.rounds,
		variant{"bare", measure(ok)}, variant{"otelhttp", measure(otel)}, variant{"inmesh", measure(st.server)})
	if err != nil {
		return nil, err
	}
	const bare, oh, im = 0, 1, 2
	r := &result{
		ratio: rs.ratio("", atMost(0.5), func(f []figures) float64 {
			return (f[im].NsPerOp - f[bare].NsPerOp) / (f[oh].NsPerOp - f[bare].NsPerOp)
		}),
		Candidate: rs.median(im), Baseline: rs.median(oh),
		Others: map[string]figures{"bare": *rs.median(bare)},
		Extra: []ratio{
			rs.ratio("added allocs: inmesh / otelhttp", noGoal, func(f []figures) float64 {
				return (f[im].Allocs - f[bare].Allocs) / (f[oh].Allocs - f[bare].Allocs)
			}),
			rs.ratio("inmesh / bare", noGoal, func(f []figures) float64 { return f[im].NsPerOp / f[bare].NsPerOp }),
			rs.ratio("otelhttp / bare", noGoal, func(f []figures) float64 { return f[oh].NsPerOp / f[bare].NsPerOp }),
		},
	}
	r.Note = "ratio = (inmesh - bare) / (otelhttp - bare) ns per request; candidate inmesh, baseline otelhttp"
	return r, nil
}

// loopbackSet is the three ways of making one HTTP/1 round trip on
// loopback: bare net/http, otelhttp on both sides, inmesh's stacks on
// both sides (no control plane: the request goes to its own address).
type loopbackSet struct {
	bare, otel, inmesh variant
	// timed is bare net/http with the inbound listener's timeouts (a
	// header deadline and an idle timeout), which the inmesh server has.
	timed variant
	close func()
}

func newLoopbackSet(n int) (*loopbackSet, error) {
	mp := newMeter()
	bareSrv := serve(&http.Server{Handler: ok})
	inbound := origproto.NewServer(nil)
	timedSrv := serve(&http.Server{Handler: ok, ReadHeaderTimeout: inbound.ReadHeaderTimeout, IdleTimeout: inbound.IdleTimeout})
	otelSrv := serve(&http.Server{Handler: otelHandler(ok, mp)})
	src, setProfile := staticProfiles()
	late := &lateHandler{}
	meshSrv := serveMeshed(late)
	st := newStack(ok, mp, src, nil, meshSrv.addr())
	late.set(st.server)
	setProfile(meshSrv.addr())
	bareRT, otelBase := h1Transport(), h1Transport()
	otelRT := otelTransport(otelBase, mp)
	meshURL := meshSrv.URL + "/books/1"
	s := &loopbackSet{close: func() {
		bareRT.CloseIdleConnections()
		otelBase.CloseIdleConnections()
		st.close()
		bareSrv.Close()
		timedSrv.Close()
		otelSrv.Close()
		meshSrv.Close()
		mp.Shutdown(context.Background())
	}}
	run := func(rt http.RoundTripper, url string) func() (figures, error) {
		return func() (figures, error) { return serial(rt, func() *http.Request { return get(url, "") }, n) }
	}
	s.bare = variant{"bare", run(bareRT, bareSrv.URL+"/books/1")}
	s.timed = variant{"bare_timeouts", run(bareRT, timedSrv.URL+"/books/1")}
	s.otel = variant{"otelhttp", run(otelRT, otelSrv.URL+"/books/1")}
	s.inmesh = variant{"inmesh", run(st.client, meshURL)}
	send := func() { _ = do(st.client, get(meshURL, "")) }
	if err := waitRoutes(st.client.Router(), meshSrv.addr(), send); err != nil {
		s.close()
		return nil, err
	}
	if err := waitRoutes(st.server.Router(), meshSrv.addr(), send); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// stackLoopback: a round trip through inmesh's client and server stacks
// against bare net/http, and its added time against otelhttp's.
func stackLoopback(o options) (*result, error) {
	s, err := newLoopbackSet(o.scale(2000, 1000))
	if err != nil {
		return nil, err
	}
	defer s.close()
	rs, err := interleave(o.rounds, s.bare, s.otel, s.inmesh, s.timed)
	if err != nil {
		return nil, err
	}
	const bare, oh, im, timed = 0, 1, 2, 3
	r := &result{
		ratio:     rs.ratio("", atMost(1.15), func(f []figures) float64 { return f[im].P50 / f[bare].P50 }),
		Candidate: rs.median(im), Baseline: rs.median(bare),
		Others: map[string]figures{"otelhttp": *rs.median(oh), "bare_timeouts": *rs.median(timed)},
		Extra: []ratio{
			rs.ratio("added p50: inmesh / otelhttp", atMost(0.5), func(f []figures) float64 {
				return (f[im].P50 - f[bare].P50) / (f[oh].P50 - f[bare].P50)
			}),
			rs.ratio("otelhttp p50 / bare", noGoal, func(f []figures) float64 { return f[oh].P50 / f[bare].P50 }),
			rs.ratio("bare with the inbound listener's timeouts p50 / bare", noGoal, func(f []figures) float64 { return f[timed].P50 / f[bare].P50 }),
			rs.ratio("inmesh p50 / bare with the same timeouts", noGoal, func(f []figures) float64 { return f[im].P50 / f[timed].P50 }),
		},
	}
	r.Note = "ratio = p50 through both inmesh stacks / bare net/http p50"
	return r, nil
}
