package policy

import (
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// ErrPrefixRedirect fails a redirect that replaces a path prefix when the
// request matched no path prefix: a filter that cannot apply, answered
// with a 500 as Linkerd's proxy does.
var ErrPrefixRedirect = errors.New("a redirect may only replace the path prefix when a path prefix matched")

// Location is the Location of a redirect of req by rd, matched by m;
// same is true when it would send the client to the URL it asked for, in
// which case the filter does nothing (linkerd2-proxy's redirect.rs).
//
// The scheme is rd's or the request's (http when unknown). The port is
// rd's; without one the request's, unless rd changes the scheme, which
// implies its well-known port; a port that is the scheme's well-known
// one is left out (the Gateway API's HTTPRequestRedirectFilter). A full
// path replaces the path and the query (it may carry a query of its own);
// a prefix replacement keeps the rest of the path and the query.
func (rd *Redirect) Location(req *http.Request, m Match) (loc string, same bool, err error) {
	u := req.URL
	authority := req.Host
	if authority == "" {
		authority = u.Host
	}
	origScheme := u.Scheme
	if origScheme == "" {
		origScheme = "http"
	}
	scheme := origScheme
	if rd.Scheme != "" {
		scheme = strings.ToLower(rd.Scheme)
	}
	host, port := splitHostPort(authority)
	if rd.Host != "" {
		host = rd.Host
	}
	switch {
	case rd.Port != 0:
		port = strconv.Itoa(int(rd.Port))
	case scheme != origScheme:
		port = ""
	}
	if port == defaultPort(scheme) {
		port = ""
	}
	if port != "" {
		host += ":" + port
	}
	path, query := u.Path, u.RawQuery
	if rd.Path != nil {
		switch {
		case !rd.Path.Prefix:
			path, query, _ = strings.Cut(rd.Path.Full, "?")
		case m.Path != PathPrefix || m.PathLen > len(u.Path):
			return "", false, ErrPrefixRedirect
		default:
			// Replace the part the prefix matched; the rest of the path
			// follows the new prefix.
			rest := u.Path[m.PathLen:]
			if rest != "" && !strings.HasPrefix(rest, "/") {
				rest = "/" + rest
			}
			path = strings.TrimSuffix(rd.Path.Full, "/") + rest
			if path == "" {
				path = "/"
			}
		}
	}
	out := url.URL{Scheme: scheme, Host: host, Path: path, RawQuery: query}
	loc = out.String()
	orig := url.URL{Scheme: origScheme, Host: authority, Path: u.Path, RawQuery: u.RawQuery}
	return loc, loc == orig.String(), nil
}

// defaultPort is the well-known port of an http or https scheme.
func defaultPort(scheme string) string {
	switch scheme {
	case "http":
		return "80"
	case "https":
		return "443"
	}
	return ""
}

func splitHostPort(hp string) (string, string) {
	i := strings.LastIndexByte(hp, ':')
	if i < 0 || strings.HasSuffix(hp, "]") {
		return hp, ""
	}
	return hp[:i], hp[i+1:]
}
