package main

import (
	"net/http"
	"net/http/httputil"
	"net/url"

	"github.com/inmesh/inmesh/examples/internal/proxylog"
)

// outboundProxy forwards the application's requests to their Host through
// the outbound stack rt; its errors are logged through l's rate limit.
func outboundProxy(rt http.RoundTripper, l *proxylog.Logger) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme, pr.Out.URL.Host = "http", pr.In.Host
			pr.Out.Host = pr.In.Host
			forwardTrailers(pr)
		},
		Transport:    rt,
		ErrorHandler: l.ErrorHandler,
		ErrorLog:     l.ErrorLog(),
	}
}

// inboundProxy forwards requests from peers to the application at app
// through rt, keeping their Host; its errors are logged through l's rate
// limit.
func inboundProxy(app *url.URL, rt http.RoundTripper, l *proxylog.Logger) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(app)
			pr.Out.Host = pr.In.Host
			forwardTrailers(pr)
		},
		Transport:    rt,
		ErrorHandler: l.ErrorHandler,
		ErrorLog:     l.ErrorLog(),
	}
}
