package main

import (
	"net/http"
)

// sidecarHop: one nginx hop (a sidecar proxy) in front of the same server,
// against going direct, with inmesh's two stacks measured in the same
// rounds for comparison.
func sidecarHop(o options) (*result, error) {
	backend := serve(&http.Server{Handler: ok})
	defer backend.Close()
	ng, err := startNginx(backend.addr())
	if err != nil {
		return &result{Skipped: err.Error()}, nil
	}
	defer ng.stop()
	n := o.scale(2000, 500)
	s, err := newLoopbackSet(n)
	if err != nil {
		return nil, err
	}
	defer s.close()
	rt := h1Transport()
	defer rt.CloseIdleConnections()
	hop := variant{"nginx", withConns(backend, func() (figures, error) {
		return serial(rt, func() *http.Request { return get("http://"+ng.addr+"/books/1", "") }, n)
	})}
	rs, err := interleave(o.rounds, s.bare, hop, s.inmesh)
	if err != nil {
		return nil, err
	}
	const bare, hp, im = 0, 1, 2
	r := &result{
		ratio:     rs.ratio("", noGoal, func(f []figures) float64 { return f[hp].P50 / f[bare].P50 }),
		Candidate: rs.median(hp), Baseline: rs.median(bare),
		Others: map[string]figures{"inmesh": *rs.median(im)},
		Extra: []ratio{
			rs.ratio("inmesh stacks p50 / bare", noGoal, func(f []figures) float64 { return f[im].P50 / f[bare].P50 }),
			rs.ratio("added p50: inmesh stacks / nginx hop", noGoal, func(f []figures) float64 {
				return (f[im].P50 - f[bare].P50) / (f[hp].P50 - f[bare].P50)
			}),
		},
	}
	r.Note = "ratio = p50 through one nginx hop / direct (informational, no goal); connections = upstream keep-alive connections nginx opened"
	return r, nil
}
