package main

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/inmesh/inmesh/mesh"
	origproto "github.com/inmesh/inmesh/orig-proto"
	"github.com/inmesh/inmesh/tap"
)

// tapViewer: a request through the inbound stack while a tap viewer
// streams every request's event over HTTP (one JSON line each, read by a
// client on loopback), against the same stack built without a tap; and,
// beside it, the stack with a tap that nobody watches, which must cost a
// request nothing but a branch.
func tapViewer(o options) (*result, error) {
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	hub := tap.NewHub()
	plain := mesh.NewServer(ok, mesh.WithMeterProvider(mp), mesh.WithLogger(quiet))
	defer plain.Close()
	plainSrv := serve(origproto.NewServer(plain))
	defer plainSrv.Close()
	tapped := mesh.NewServer(ok, mesh.WithMeterProvider(mp), mesh.WithLogger(quiet), mesh.WithTap(hub))
	defer tapped.Close()
	tappedSrv := serve(origproto.NewServer(tapped))
	defer tappedSrv.Close()
	tapSrv := serve(&http.Server{Handler: hub})
	defer tapSrv.Close()

	rt := h1Transport()
	defer rt.CloseIdleConnections()
	n := o.scale(3000, 500)
	run := func(url string) func() (figures, error) {
		return func() (figures, error) { return serial(rt, func() *http.Request { return get(url, "") }, n) }
	}
	// The viewer variant opens a tap stream, checks that it carries the
	// requests, reads it to the end of the variant, then closes it.
	viewed := func() (figures, error) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, tapSrv.URL+"/", nil)
		if err != nil {
			return figures{}, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return figures{}, err
		}
		defer resp.Body.Close()
		lines := make(chan int, 1)
		first := make(chan struct{})
		go func() {
			sc := bufio.NewScanner(resp.Body)
			seen := 0
			for sc.Scan() {
				if len(sc.Bytes()) > 0 {
					if seen++; seen == 1 {
						close(first)
					}
				}
			}
			lines <- seen
		}()
		f, err := run(tappedSrv.URL + "/")()
		if err != nil {
			return f, err
		}
		// The stream sends what queued within its flush delay in one
		// write: a short run (a warm-up's) can end before the first one.
		// The viewer is given until its first line, or a generous
		// deadline, before the stream is closed.
		select {
		case <-first:
		case <-time.After(10 * time.Second):
		}
		cancel()
		if seen := <-lines; seen == 0 {
			return f, fmt.Errorf("tap: the viewer saw none of %d requests", n)
		}
		return f, nil
	}
	rs, err := interleave(o.rounds, variant{"no_tap", run(plainSrv.URL + "/")}, variant{"tap_idle", run(tappedSrv.URL + "/")}, variant{"tap_viewer", viewed})
	if err != nil {
		return nil, err
	}
	const none, idle, viewer = 0, 1, 2
	r := &result{
		ratio:     rs.ratio("", atMost(1.05), func(f []figures) float64 { return f[viewer].P50 / f[none].P50 }),
		Candidate: rs.median(viewer), Baseline: rs.median(none),
		Others: map[string]figures{"tap_idle": *rs.median(idle)},
		Extra: []ratio{
			rs.ratio("p50 with a tap nobody watches / without a tap", atMost(1.02), func(f []figures) float64 { return f[idle].P50 / f[none].P50 }),
			rs.ratio("allocations added per request by a tap nobody watches", atMost(0), func(f []figures) float64 {
				if v := math.Round(f[idle].Allocs - f[none].Allocs); v != 0 {
					return v
				}
				return 0
			}),
		},
	}
	r.Note = "ratio = p50 through the inbound stack while a tap viewer streams every request's event over HTTP / the same stack without a tap, plaintext HTTP/1 clients on loopback"
	return r, nil
}
