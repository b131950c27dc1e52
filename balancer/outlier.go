package balancer

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/inmesh/inmesh/internal/meshtrace"
)

// Defaults of outlier detection: gRFC A50's (grpc-go's outlierdetection
// balancer and Envoy's outlier detection use the same).
const (
	DefaultOutlierInterval           = 10 * time.Second
	DefaultBaseEjectionTime          = 30 * time.Second
	DefaultMaxEjectionTime           = 300 * time.Second
	DefaultMaxEjectionPercent        = 10
	DefaultSuccessRateStdevFactor    = 1900
	DefaultSuccessRateEnforcement    = 100
	DefaultSuccessRateMinimumHosts   = 5
	DefaultSuccessRateRequestVolume  = 100
	DefaultFailurePercentThreshold   = 85
	DefaultFailurePercentEnforcement = 0
	DefaultFailurePercentMinHosts    = 5
	DefaultFailurePercentVolume      = 50
	// minOutlierInterval is the shortest interval the balancer runs: an
	// interval of 0 (valid in A50) is run this often.
	minOutlierInterval = time.Millisecond
)

// OutlierDetection ejects endpoints whose success rate over an interval is
// an outlier among their peers, beside failure accrual's consecutive
// failures: gRFC A50's configuration and semantics, as grpc-go's
// outlierdetection balancer implements them. Every field is taken as it
// is (a zero is a zero, as in A50); [DefaultOutlierDetection] fills in
// A50's defaults.
//
// Every Interval (checked by the first request after it ends, on the
// balancer's clock), the outcomes each endpoint answered since the last
// check are counted (a failure as failure accrual counts one). Then:
//
//   - success-rate ejection (when SuccessRateEjection is set): among the
//     endpoints with at least RequestVolume outcomes, when there are at
//     least MinimumHosts of them, an endpoint whose success rate is below
//     mean - stdev * StdevFactor/1000 of theirs is ejected with probability
//     EnforcementPercentage%;
//   - failure-percentage ejection (when FailurePercentageEjection is set):
//     among the endpoints with at least RequestVolume outcomes, when there
//     are at least MinimumHosts of them, an endpoint whose failures are more
//     than Threshold percent of its outcomes is ejected with probability
//     EnforcementPercentage%;
//   - no endpoint is ejected while MaxEjectionPercent percent of the
//     endpoints or more are ejected already (the first is always allowed
//     with a positive cap);
//   - an ejected endpoint comes back once BaseEjectionTime times its
//     ejection count, at most max(BaseEjectionTime, MaxEjectionTime), has
//     passed since its ejection; each interval it spends in rotation takes
//     one from its ejection count.
//
// Intervals follow one another from the first request on, whether requests
// come or not, as grpc-go's interval timer fires: a check after a quiet
// spell runs every interval that ended meanwhile, the ones without
// outcomes ejecting nothing but bringing ejected endpoints back and taking
// one from the ejection counts of those in rotation, each at its own end.
//
// An ejected endpoint gets no request (the queue and fail-fast apply as
// when failure accrual trips every endpoint) and counts as pending in
// outbound_http_balancer_endpoints. With neither ejection set, nothing is
// ejected.
type OutlierDetection struct {
	Interval                  time.Duration
	BaseEjectionTime          time.Duration
	MaxEjectionTime           time.Duration
	MaxEjectionPercent        uint32
	SuccessRateEjection       *SuccessRateEjection
	FailurePercentageEjection *FailurePercentageEjection
}

// SuccessRateEjection is A50's success_rate_ejection.
type SuccessRateEjection struct {
	StdevFactor           uint32
	EnforcementPercentage uint32
	MinimumHosts          uint32
	RequestVolume         uint32
}

// FailurePercentageEjection is A50's failure_percentage_ejection.
type FailurePercentageEjection struct {
	Threshold             uint32
	EnforcementPercentage uint32
	MinimumHosts          uint32
	RequestVolume         uint32
}

// DefaultOutlierDetection returns A50's defaults: an interval of 10 s, a
// base ejection time of 30 s, at most 300 s, at most 10% ejected, and
// neither ejection (set one, e.g. to [DefaultSuccessRateEjection]).
func DefaultOutlierDetection() OutlierDetection {
	return OutlierDetection{Interval: DefaultOutlierInterval, BaseEjectionTime: DefaultBaseEjectionTime,
		MaxEjectionTime: DefaultMaxEjectionTime, MaxEjectionPercent: DefaultMaxEjectionPercent}
}

// DefaultSuccessRateEjection returns A50's defaults of success-rate
// ejection: a stdev factor of 1900 (1.9 standard deviations), enforced
// always, over at least 5 endpoints of at least 100 requests each.
func DefaultSuccessRateEjection() *SuccessRateEjection {
	return &SuccessRateEjection{StdevFactor: DefaultSuccessRateStdevFactor, EnforcementPercentage: DefaultSuccessRateEnforcement,
		MinimumHosts: DefaultSuccessRateMinimumHosts, RequestVolume: DefaultSuccessRateRequestVolume}
}

// DefaultFailurePercentageEjection returns A50's defaults of
// failure-percentage ejection: a threshold of 85%, over at least 5
// endpoints of at least 50 requests each, and an enforcement of 0% (A50's
// default: set EnforcementPercentage to enforce it).
func DefaultFailurePercentageEjection() *FailurePercentageEjection {
	return &FailurePercentageEjection{Threshold: DefaultFailurePercentThreshold, EnforcementPercentage: DefaultFailurePercentEnforcement,
		MinimumHosts: DefaultFailurePercentMinHosts, RequestVolume: DefaultFailurePercentVolume}
}

// Validate checks o as grpc-go's outlierdetection ParseConfig does:
// durations >= 0 and percentages <= 100. The error names the field.
func (o *OutlierDetection) Validate() error {
	if o == nil {
		return nil
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"interval", o.Interval}, {"base_ejection_time", o.BaseEjectionTime}, {"max_ejection_time", o.MaxEjectionTime}} {
		if d.v < 0 {
			return fmt.Errorf("outlier_detection.%s = %v; must be >= 0", d.name, d.v)
		}
	}
	pct := []struct {
		name string
		v    uint32
	}{{"max_ejection_percent", o.MaxEjectionPercent}}
	if s := o.SuccessRateEjection; s != nil {
		pct = append(pct, struct {
			name string
			v    uint32
		}{"success_rate_ejection.enforcement_percentage", s.EnforcementPercentage})
	}
	if f := o.FailurePercentageEjection; f != nil {
		pct = append(pct, []struct {
			name string
			v    uint32
		}{{"failure_percentage_ejection.threshold", f.Threshold}, {"failure_percentage_ejection.enforcement_percentage", f.EnforcementPercentage}}...)
	}
	for _, p := range pct {
		if p.v > 100 {
			return fmt.Errorf("outlier_detection.%s = %d; must be <= 100", p.name, p.v)
		}
	}
	return nil
}

// outlier is an OutlierDetection resolved for the sweeps; comparable, so
// that it is part of a configuration's key.
type outlier struct {
	interval, base, maxEject int64
	maxPercent               float64
	sr                       bool
	srFactor                 float64
	srEnforce                uint32
	srHosts, srVolume        int64
	fp                       bool
	fpThreshold              float64
	fpEnforce                uint32
	fpHosts, fpVolume        int64
}

// outlierOf resolves o: false when it ejects nothing (nil, or neither
// ejection set, as A50's no-op configuration). Values out of range are
// clamped (see [OutlierDetection.Validate]).
func outlierOf(o *OutlierDetection) (outlier, bool) {
	if o == nil || o.SuccessRateEjection == nil && o.FailurePercentageEjection == nil {
		return outlier{}, false
	}
	pct := func(v uint32) uint32 { return min(v, 100) }
	od := outlier{interval: int64(max(o.Interval, minOutlierInterval)), base: int64(max(o.BaseEjectionTime, 0)),
		maxEject: int64(max(o.MaxEjectionTime, 0)), maxPercent: float64(pct(o.MaxEjectionPercent))}
	if s := o.SuccessRateEjection; s != nil {
		od.sr, od.srFactor, od.srEnforce = true, float64(s.StdevFactor)/1000, pct(s.EnforcementPercentage)
		od.srHosts, od.srVolume = int64(s.MinimumHosts), int64(s.RequestVolume)
	}
	if f := o.FailurePercentageEjection; f != nil {
		od.fp, od.fpThreshold, od.fpEnforce = true, float64(pct(f.Threshold)), pct(f.EnforcementPercentage)
		od.fpHosts, od.fpVolume = int64(f.MinimumHosts), int64(f.RequestVolume)
	}
	return od, true
}

// ejectionEnd is the clock reading at which an endpoint ejected at `at`
// for the mult-th time comes back: base*mult, at most max(base, maxEject).
func (od *outlier) ejectionEnd(at int64, mult int) int64 {
	limit := max(od.base, od.maxEject)
	d := limit
	if mult <= 0 {
		d = 0
	} else if od.base <= limit/int64(mult) || od.base == 0 {
		d = min(od.base*int64(mult), limit)
	}
	if at > math.MaxInt64-d {
		return math.MaxInt64
	}
	return at + d
}

// odCount is one endpoint's outcomes over the interval that ended.
type odCount struct {
	l          *load
	succ, fail int64
}

// sweep runs the algorithm of the interval that ended at now over the
// loads of a group's endpoints (grpc-go: intervalTimerAlgorithm), keeping
// the ready count of g (nil: none) right for failure accrual's ejection
// floor. It returns whether an endpoint came back (the queue may go on).
func (od *outlier) sweep(loads []*load, now int64, g *group) (unejected bool) {
	counts := make([]odCount, len(loads))
	ejected := 0
	for i, l := range loads {
		l.mu.Lock()
		h := &l.health
		counts[i] = odCount{l: l, succ: h.odSucc, fail: h.odFail}
		h.odSucc, h.odFail = 0, 0
		if h.odEjected {
			ejected++
		}
		l.mu.Unlock()
	}
	n := float64(len(loads))
	// capped reports whether the cap forbids another ejection.
	capped := func() bool { return float64(ejected)/n*100 >= od.maxPercent }
	eject := func(c odCount, enforce uint32) {
		if rand.Uint32N(100) >= enforce {
			return
		}
		c.l.mu.Lock()
		defer c.l.mu.Unlock()
		h := &c.l.health
		if h.odEjected {
			return // both ejections found it: one ejection
		}
		if !h.tripped {
			g.addReady(-1)
		}
		h.odEjected, h.odAt = true, now
		h.odMult++
		ejected++
	}
	// volume returns the endpoints with at least min outcomes: with a
	// request volume of 0, every endpoint, those without a request this
	// interval too (grpc-go: endpointsWithAtLeastRequestVolume).
	volume := func(min int64) []odCount {
		var out []odCount
		for _, c := range counts {
			if c.succ+c.fail >= min {
				out = append(out, c)
			}
		}
		return out
	}
	if od.sr {
		// An endpoint without outcomes has no success rate: grpc-go
		// computes it as 0/0, a NaN that makes the mean NaN, and no rate
		// is below a NaN: success-rate ejection ejects nothing that
		// interval.
		if cands := volume(od.srVolume); int64(len(cands)) >= od.srHosts && len(cands) > 0 &&
			!slices.ContainsFunc(cands, odCount.none) {
			var mean, sq float64
			for _, c := range cands {
				mean += float64(c.succ) / float64(c.succ+c.fail)
			}
			mean /= float64(len(cands))
			for _, c := range cands {
				d := float64(c.succ)/float64(c.succ+c.fail) - mean
				sq += d * d
			}
			required := mean - math.Sqrt(sq/float64(len(cands)))*od.srFactor
			for _, c := range cands {
				if capped() {
					break
				}
				if float64(c.succ)/float64(c.succ+c.fail) < required {
					eject(c, od.srEnforce)
				}
			}
		}
	}
	if od.fp {
		if cands := volume(od.fpVolume); int64(len(cands)) >= od.fpHosts && len(cands) > 0 {
			for _, c := range cands {
				if capped() {
					break
				}
				// An endpoint without outcomes counts among the hosts but
				// has no failure percentage (grpc-go's 0/0 is NaN, above no
				// threshold): it is never ejected.
				if !c.none() && float64(c.fail)/float64(c.succ+c.fail)*100 > od.fpThreshold {
					eject(c, od.fpEnforce)
				}
			}
		}
	}
	for _, l := range loads {
		l.mu.Lock()
		h := &l.health
		switch {
		case !h.odEjected && h.odMult > 0:
			h.odMult--
		case h.odEjected && now > od.ejectionEnd(h.odAt, h.odMult):
			h.uneject(g)
			unejected = true
		}
		l.mu.Unlock()
	}
	return unejected
}

// idle runs the n intervals that ended after the one swept at `from` (at
// from+interval, from+2*interval, ...) with no outcome counted: they eject
// nothing, an endpoint in rotation has its ejection count lowered by one
// at each of them, and an ejected endpoint comes back at the first whose
// end is past its ejection's, its count lowered at each one after that
// (grpc-go's intervalTimerAlgorithm, as its timer runs it n times over an
// idle channel). It keeps g's ready count right as sweep does, and returns
// whether an endpoint came back.
func (od *outlier) idle(loads []*load, from, n int64, g *group) (unejected bool) {
	if n <= 0 {
		return false
	}
	for _, l := range loads {
		l.mu.Lock()
		h := &l.health
		steps := n // the intervals it spends in rotation
		if h.odEjected {
			// The first interval ending past end: from + j*interval > end.
			j := int64(1)
			if end := od.ejectionEnd(h.odAt, h.odMult); end >= from {
				j = (end-from)/od.interval + 1
			}
			if j > n {
				l.mu.Unlock()
				continue
			}
			h.uneject(g)
			unejected = true
			steps = n - j
		}
		h.odMult = int(max(int64(h.odMult)-steps, 0))
		l.mu.Unlock()
	}
	return unejected
}

// uneject brings an ejected endpoint back into rotation, and into g's
// ready count unless failure accrual holds it out. It is called under
// l.mu.
func (h *health) uneject(g *group) {
	h.odEjected, h.odAt = false, 0
	if !h.tripped {
		g.addReady(1)
	}
}

// none reports whether c counts no outcome.
func (c odCount) none() bool { return c.succ+c.fail == 0 }

// count folds one outcome into the endpoint's counts of the interval; it
// is called under l.mu.
func (h *health) countLocked(failure bool) {
	if failure {
		h.odFail++
	} else {
		h.odSucc++
	}
}

// sweepOutliers runs the group's outlier detection when its interval has
// ended at now: the interval that ended first, over the outcomes counted
// since the last check, then every later one that ended by now, idle. The
// first call starts the first interval; the next ones follow it back to
// back. Without outlier detection it costs one nil check.
func (g *group) sweepOutliers(now int64) {
	od := g.conf.od
	if od == nil {
		return
	}
	next := g.odNext.Load()
	if next == 0 {
		g.odNext.CompareAndSwap(0, now+od.interval)
		return
	}
	if now < next {
		return
	}
	ended := (now-next)/od.interval + 1
	if !g.odNext.CompareAndSwap(next, next+ended*od.interval) {
		return
	}
	g.odMu.Lock()
	s := g.state.Load()
	loads := make([]*load, len(s.eps))
	for i, e := range s.eps {
		loads[i] = e.load
	}
	back := od.sweep(loads, next, g)
	back = od.idle(loads, next, ended-1, g) || back
	n := 0
	for _, l := range loads {
		l.mu.Lock()
		if l.health.odEjected {
			n++
		}
		l.mu.Unlock()
	}
	g.odEjected.Store(int64(n))
	g.odMu.Unlock()
	if back {
		g.notify()
	}
}

// ejectedEvent adds the endpoint_skipped event to the span of ctx when
// outlier detection had endpoints of g ejected at its last sweep: the
// request's pick was made without them.
func (g *group) ejectedEvent(ctx context.Context) {
	if n := g.odEjected.Load(); n > 0 {
		meshtrace.EventWith(ctx, meshtrace.EventEndpointSkipped, meshtrace.AttrEjected.Int64(n))
	}
}

// WithOutlierDetection ejects endpoints whose success rate is an outlier
// among their peers, as o says (default: none; see [OutlierDetection]). o
// is copied; nil, or one with neither ejection, changes nothing. Values
// out of range are clamped ([OutlierDetection.Validate] reports them).
func WithOutlierDetection(o *OutlierDetection) Option {
	return optionFunc(func(c *config) {
		if od, ok := outlierOf(o); ok {
			c.outlier = &od
		}
	})
}
