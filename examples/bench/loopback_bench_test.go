package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"testing"
)

// BenchmarkStackLoopback is one serial HTTP/1 round trip on loopback
// through inmesh's client and server stacks (stack_loopback's inmesh
// variant) beside bare net/http, for -memprofile and -cpuprofile.
func BenchmarkStackLoopback(b *testing.B) {
	slog.SetDefault(slog.New(slog.NewTextHandler(io.Discard, nil)))
	mp := newMeter()
	defer mp.Shutdown(context.Background())
	bareSrv := serve(&http.Server{Handler: ok})
	defer bareSrv.Close()
	src, setProfile := staticProfiles()
	late := &lateHandler{}
	meshSrv := serveMeshed(late)
	defer meshSrv.Close()
	st := newStack(ok, mp, src, nil, meshSrv.addr())
	defer st.close()
	late.set(st.server)
	setProfile(meshSrv.addr())
	bareRT := h1Transport()
	defer bareRT.CloseIdleConnections()
	meshURL := meshSrv.URL + "/books/1"
	send := func() { _ = do(st.client, get(meshURL, "")) }
	if err := waitRoutes(st.client.Router(), meshSrv.addr(), send); err != nil {
		b.Fatal(err)
	}
	if err := waitRoutes(st.server.Router(), meshSrv.addr(), send); err != nil {
		b.Fatal(err)
	}
	for _, v := range []struct {
		name string
		rt   http.RoundTripper
		url  string
	}{{"bare", bareRT, bareSrv.URL + "/books/1"}, {"inmesh", st.client, meshURL}} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := do(v.rt, get(v.url, "")); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
