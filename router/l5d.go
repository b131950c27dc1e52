package router

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/inmesh/inmesh/policy"
	"google.golang.org/grpc/codes"
)

// The per-request override headers of Linkerd's policy routes.
var l5dHeaders = [...]string{
	"L5d-Retry-Http", "L5d-Retry-Grpc", "L5d-Retry-Limit", "L5d-Retry-Timeout",
	"L5d-Timeout", "L5d-Request-Timeout", "L5d-Response-Timeout",
}

func hasL5d(h http.Header) bool {
	for _, k := range l5dHeaders {
		if _, ok := h[k]; ok {
			return true
		}
	}
	return false
}

func stripL5d(h http.Header) {
	for _, k := range l5dHeaders {
		delete(h, k)
	}
}

// overrideL5d returns the retry and timeouts of a request whose headers
// override the rule's. A header that does not parse is ignored.
// l5d-retry-http and l5d-retry-grpc apply on routes of either kind, as in
// Linkerd's proxy: a gRPC call on an HTTPRoute may name retryable codes,
// and one on a GRPCRoute retryable HTTP statuses.
func overrideL5d(h http.Header, retry *policy.Retry, t policy.Timeouts) (*policy.Retry, policy.Timeouts) {
	var r policy.Retry
	if retry != nil {
		r = *retry
	}
	set := retry != nil
	if v := h.Get("L5d-Retry-Http"); v != "" {
		if ranges, ok := parseStatusRanges(v); ok {
			r.StatusRanges, set = ranges, true
		}
	}
	if v := h.Get("L5d-Retry-Grpc"); v != "" {
		if cs, ok := parseCodes(v); ok {
			r.GRPCCodes, set = cs, true
		}
	}
	if v := h.Get("L5d-Retry-Limit"); v != "" {
		if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 32); err == nil {
			if n == 0 {
				return nil, timeoutsOverride(h, t)
			}
			r.MaxRetries, set = uint32(n), true
		}
	}
	if v := h.Get("L5d-Retry-Timeout"); v != "" {
		if d, ok := parseDuration(v); ok {
			r.Timeout, set = d, true
		}
	}
	t = timeoutsOverride(h, t)
	if !set {
		return nil, t
	}
	return &r, t
}

func timeoutsOverride(h http.Header, t policy.Timeouts) policy.Timeouts {
	for _, k := range [...]string{"L5d-Request-Timeout", "L5d-Timeout"} {
		if d, ok := parseDuration(h.Get(k)); ok {
			t.Request = d
		}
	}
	if d, ok := parseDuration(h.Get("L5d-Response-Timeout")); ok {
		t.Response = d
	}
	return t
}

// parseDuration reads a Go duration ("1.5s", "100ms") or a number of
// milliseconds.
func parseDuration(v string) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(n) * time.Millisecond, true
	}
	d, err := time.ParseDuration(v)
	return d, err == nil && d >= 0
}

// parseStatusRanges reads the l5d-retry-http (retry.linkerd.io/http) list:
// "5xx", "gateway-error" (502-504), "NNN", "NNN-MMM".
func parseStatusRanges(v string) ([]policy.StatusRange, bool) {
	var out []policy.StatusRange
	for _, f := range strings.Split(v, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		switch {
		case f == "":
			continue
		case f == "5xx":
			out = append(out, policy.StatusRange{Start: 500, End: 599})
		case f == "gateway-error":
			out = append(out, policy.StatusRange{Start: 502, End: 504})
		default:
			lo, hi, isRange := strings.Cut(f, "-")
			a, err := strconv.ParseUint(lo, 10, 16)
			if err != nil || a < 100 || a > 599 {
				return nil, false
			}
			b := a
			if isRange {
				if b, err = strconv.ParseUint(hi, 10, 16); err != nil || b < a || b > 599 {
					return nil, false
				}
			}
			out = append(out, policy.StatusRange{Start: uint16(a), End: uint16(b)})
		}
	}
	return out, len(out) > 0
}

var grpcRetryCodes = map[string]codes.Code{
	"cancelled": codes.Canceled, "deadline-exceeded": codes.DeadlineExceeded, "internal": codes.Internal,
	"resource-exhausted": codes.ResourceExhausted, "unavailable": codes.Unavailable,
}

// parseCodes reads the l5d-retry-grpc (retry.linkerd.io/grpc) list.
func parseCodes(v string) ([]codes.Code, bool) {
	var out []codes.Code
	for _, f := range strings.Split(v, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		if f == "" {
			continue
		}
		c, ok := grpcRetryCodes[f]
		if !ok {
			return nil, false
		}
		out = append(out, c)
	}
	return out, len(out) > 0
}
