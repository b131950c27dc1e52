package main

import (
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"

	"github.com/inmesh/inmesh/examples/internal/proxylog"
	"github.com/inmesh/inmesh/internal/authority"
	"github.com/inmesh/inmesh/internal/proxyerr"
)

// outboundProxy forwards the application's requests to their Host through
// the outbound stack rt; its errors are logged through l's rate limit. A
// request whose Host names no destination (none, an empty one, a bad
// port) is the application's mistake: 400, logged at debug level.
func outboundProxy(rt http.RoundTripper, l *proxylog.Logger) http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", pr.In.Host
			pr.Out.Host = pr.In.Host
			forwardTrailers(pr)
			proxylog.ClientBody(pr)
		},
		Transport:    rt,
		ErrorHandler: l.ErrorHandler,
		ErrorLog:     l.ErrorLog(),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			refuseConnect(w, r)
			return
		}
		if !routable(r.Host) {
			l.BadRequest(w, r, "no destination in Host "+strconv.Quote(r.Host))
			return
		}
		rp.ServeHTTP(w, r)
	})
}

// routable reports whether host, with its port or without one (80), names
// a destination.
func routable(host string) bool {
	_, err := authority.NormalizeDefaultPort(host, "80")
	return err == nil
}

// refuseConnect answers a CONNECT with 501: the sidecar forwards
// requests and upgrades, not CONNECT tunnels, which a ReverseProxy would
// answer 200 and then carry nothing through.
func refuseConnect(w http.ResponseWriter, r *http.Request) {
	proxyerr.Write(w, r, http.StatusNotImplemented, "CONNECT is not proxied")
}

// inboundProxy forwards requests from peers to the application at app
// through rt, keeping their Host; its errors are logged through l's rate
// limit. A CONNECT is refused (refuseConnect).
func inboundProxy(app *url.URL, rt http.RoundTripper, l *proxylog.Logger) http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(app)
			pr.Out.Host = pr.In.Host
			forwardTrailers(pr)
			proxylog.ClientBody(pr)
		},
		Transport:    rt,
		ErrorHandler: l.ErrorHandler,
		ErrorLog:     l.ErrorLog(),
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			refuseConnect(w, r)
			return
		}
		rp.ServeHTTP(w, r)
	})
}
