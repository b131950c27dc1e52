// Package authority parses and checks the host:port authorities that name
// destinations.
package authority

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// Split parses host:port as a control plane does: the port is required and
// in 1-65535; the host is a DNS name or an IP address. The host is returned
// in lower case without a trailing dot.
func Split(authority string) (host string, port uint32, err error) {
	h, p, err := net.SplitHostPort(authority)
	if err != nil {
		return "", 0, fmt.Errorf("%q is not host:port", authority)
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return "", 0, fmt.Errorf("%q has a bad port", authority)
	}
	h = strings.ToLower(strings.TrimSuffix(h, "."))
	if _, err := netip.ParseAddr(h); err != nil && !ValidDNSName(h) {
		return "", 0, fmt.Errorf("%q has a bad host", authority)
	}
	return h, uint32(n), nil
}

// Normalize returns host:port in the form of [Split].
func Normalize(authority string) (string, error) {
	host, port, err := Split(authority)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, strconv.FormatUint(uint64(port), 10)), nil
}

// NormalizeDefaultPort is [Normalize] for an authority that may leave out
// its port, which is then port: "books" is "books:80" with port "80".
func NormalizeDefaultPort(authority, port string) (string, error) {
	if n, err := Normalize(authority); err == nil {
		return n, nil
	}
	return Normalize(authority + ":" + port)
}

// ValidDNSName reports whether s is a DNS name of letters, digits, hyphens,
// underscores and dots (labels of 1 to 63 bytes, 253 bytes at most).
func ValidDNSName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	for _, label := range strings.Split(s, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// IsLoopbackHost reports whether hostport (a Host header, with or without a
// port) names this machine's loopback: "localhost" or a loopback IP
// literal. A surface served to loopback clients alone checks it too, so
// that a page a browser loaded from another name, which that name's DNS
// then points at 127.0.0.1 (DNS rebinding), is refused.
func IsLoopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}
