package router

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
)

// ExplainHandler returns an admin handler that answers
// GET ?authority=host:port&method=GET&path=/x with the JSON [Explanation]
// of such a request (method defaults to GET, path to "/"; a header=Name:Value
// parameter, repeatable, adds request headers). A missing or invalid
// authority is a 400. Each new authority starts its watches, within the
// router's bound: serve this on an operator's listener only.
func (r *Router) ExplainHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		authority := q.Get("authority")
		if authority == "" {
			http.Error(w, "authority: required (host:port)", http.StatusBadRequest)
			return
		}
		if _, err := r.normalize(authority); err != nil {
			http.Error(w, "authority: "+err.Error(), http.StatusBadRequest)
			return
		}
		method := q.Get("method")
		if method == "" {
			method = http.MethodGet
		}
		path := q.Get("path")
		if path == "" {
			path = "/"
		}
		u, err := url.ParseRequestURI(path)
		if err != nil {
			http.Error(w, "path: "+err.Error(), http.StatusBadRequest)
			return
		}
		u.Scheme, u.Host = "http", authority
		probe, err := http.NewRequestWithContext(req.Context(), method, u.String(), nil)
		if err != nil {
			http.Error(w, "method: "+err.Error(), http.StatusBadRequest)
			return
		}
		for _, h := range q["header"] {
			name, value, ok := strings.Cut(h, ":")
			if !ok || name == "" {
				http.Error(w, "header: want Name:Value", http.StatusBadRequest)
				return
			}
			probe.Header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
		}
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(r.Explain(probe))
	})
}
