package hedge

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// DefaultMaxExtraLoad is the share of a route's requests that may be
// hedged when a policy sets none: 5%.
const DefaultMaxExtraLoad = 0.05

// DefaultMinSamples is how many latencies a route must have observed
// before a percentile delay applies; until then its requests are not
// hedged.
const DefaultMinSamples = 20

// MaxDelay bounds a fixed delay (a delay past it is refused as a mistake).
const MaxDelay = time.Hour

// Policy is the hedging of one route. Its zero value hedges nothing; a
// policy hedges when it sets a Delay or a Percentile.
type Policy struct {
	// Delay is how long the first attempt runs before the hedge is sent
	// (a fixed delay). Ignored when Percentile is set.
	Delay time.Duration
	// Percentile, when above zero (and below 100), makes the delay the
	// route's observed latency at that percentile (95 is its p95), learnt
	// from its own requests; until [DefaultMinSamples] are observed no
	// request is hedged.
	Percentile float64
	// MaxExtraLoad is the share of the route's requests that may be
	// hedged, from 0 to 1; zero means [DefaultMaxExtraLoad].
	MaxExtraLoad float64
	// Idempotent marks every request of the route safe to send twice,
	// whatever its method. Otherwise only the methods RFC 9110 (9.2.2)
	// calls idempotent are hedged.
	Idempotent bool
}

// Enabled reports whether p hedges at all.
func (p *Policy) Enabled() bool { return p != nil && (p.Delay > 0 || p.Percentile > 0) }

// ExtraLoad returns the share of extra load, the default for zero.
func (p *Policy) ExtraLoad() float64 {
	if p.MaxExtraLoad <= 0 {
		return DefaultMaxExtraLoad
	}
	return p.MaxExtraLoad
}

// Validate reports a policy whose fields are out of range, naming the
// field.
func (p *Policy) Validate() error {
	switch {
	case p.Delay < 0 || p.Delay > MaxDelay:
		return fmt.Errorf("delay: %v is not between 0 and %v", p.Delay, MaxDelay)
	case math.IsNaN(p.Percentile) || p.Percentile < 0 || p.Percentile >= 100:
		return fmt.Errorf("percentile: %v is not between 0 and 100 (exclusive)", p.Percentile)
	case math.IsNaN(p.MaxExtraLoad) || p.MaxExtraLoad < 0 || p.MaxExtraLoad > 1:
		return fmt.Errorf("maxExtraLoad: %v is not between 0 and 1", p.MaxExtraLoad)
	}
	return nil
}

// String describes p for people ("after p95 (learnt), at most 5% extra
// load, idempotent methods").
func (p *Policy) String() string {
	if !p.Enabled() {
		return "off"
	}
	var b strings.Builder
	b.WriteString("after ")
	if p.Percentile > 0 {
		b.WriteString(FormatPercentile(p.Percentile))
		b.WriteString(" of the route's latency")
	} else {
		b.WriteString(p.Delay.String())
	}
	b.WriteString(", at most ")
	b.WriteString(strconv.FormatFloat(p.ExtraLoad()*100, 'g', -1, 64))
	b.WriteString("% extra load, ")
	if p.Idempotent {
		b.WriteString("every method (route idempotent)")
	} else {
		b.WriteString("idempotent methods")
	}
	return b.String()
}

// FormatPercentile writes a percentile as the delay annotation does: "p95",
// "p99.9".
func FormatPercentile(q float64) string { return "p" + strconv.FormatFloat(q, 'g', -1, 64) }

// ParseDelay reads a delay as the hedge.inmesh.io/delay annotation gives
// it: a duration ("20ms", "1.5s", or a bare number of milliseconds) for a
// fixed delay, or "pNN" ("p95", "p99.9") for that percentile of the
// route's observed latency.
func ParseDelay(s string) (delay time.Duration, percentile float64, err error) {
	s = strings.TrimSpace(s)
	if rest, ok := strings.CutPrefix(strings.ToLower(s), "p"); ok {
		q, err := strconv.ParseFloat(rest, 64)
		if err != nil || math.IsNaN(q) || q <= 0 || q >= 100 {
			return 0, 0, fmt.Errorf("%q is not a percentile like p95 (above p0, below p100)", s)
		}
		return 0, q, nil
	}
	if n, err := strconv.ParseUint(s, 10, 32); err == nil {
		delay = time.Duration(n) * time.Millisecond
	} else if delay, err = time.ParseDuration(s); err != nil {
		return 0, 0, fmt.Errorf("%q is not a duration like 20ms or a percentile like p95", s)
	}
	if delay <= 0 || delay > MaxDelay {
		return 0, 0, fmt.Errorf("%q is not above 0 and at most %v", s, MaxDelay)
	}
	return delay, 0, nil
}

// ParseMaxExtraLoad reads a share of extra load as the
// hedge.inmesh.io/max-extra-load annotation gives it: a percentage ("5%")
// or a fraction ("0.05"), from 0 to 100%.
func ParseMaxExtraLoad(s string) (float64, error) {
	t := strings.TrimSpace(s)
	pct := strings.HasSuffix(t, "%")
	v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(t, "%")), 64)
	if err == nil && pct {
		v /= 100
	}
	if err != nil || math.IsNaN(v) || v <= 0 || v > 1 {
		return 0, fmt.Errorf("%q is not a share like 5%% or 0.05 (above 0, at most 100%%)", s)
	}
	return v, nil
}

var errBool = errors.New("not true or false")

// ParseBool reads the hedge.inmesh.io/idempotent annotation: "true" or
// "false".
func ParseBool(s string) (bool, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("%q is %w", s, errBool)
}

// IdempotentMethod reports whether RFC 9110 (section 9.2.2) calls method
// idempotent: GET, HEAD, OPTIONS, TRACE, PUT and DELETE.
func IdempotentMethod(method string) bool {
	switch method {
	case http.MethodGet, "", http.MethodHead, http.MethodOptions, http.MethodTrace, http.MethodPut, http.MethodDelete:
		return true
	}
	return false
}
