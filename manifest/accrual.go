package manifest

import (
	"strconv"
	"strings"
	"time"

	"github.com/inmesh/inmesh/backoff"
	"github.com/inmesh/inmesh/policy"
)

// The failure-accrual annotations of a Service, as Linkerd's policy
// controller reads them; they configure the circuit breaker of each
// endpoint of the Service's backends.
const (
	AnnotationFailureAccrual             = "balancer.linkerd.io/failure-accrual" // consecutive or unified
	AnnotationAccrualMaxFailures         = "balancer.linkerd.io/failure-accrual-consecutive-max-failures"
	AnnotationAccrualMinPenalty          = "balancer.linkerd.io/failure-accrual-consecutive-min-penalty"
	AnnotationAccrualMaxPenalty          = "balancer.linkerd.io/failure-accrual-consecutive-max-penalty"
	AnnotationAccrualJitterRatio         = "balancer.linkerd.io/failure-accrual-consecutive-jitter-ratio"
	AnnotationAccrualSuccessRate         = "balancer.alpha.linkerd.io/failure-accrual-success-rate-threshold"
	AnnotationAccrualSuccessRateWindow   = "balancer.alpha.linkerd.io/failure-accrual-success-rate-window"
	AnnotationAccrualSuccessRateRequests = "balancer.alpha.linkerd.io/failure-accrual-success-rate-min-requests"
)

// Defaults of the failure-accrual annotations (Linkerd's).
const (
	DefaultAccrualMaxFailures  = 7
	DefaultAccrualMinPenalty   = time.Second
	DefaultAccrualMaxPenalty   = time.Minute
	DefaultAccrualJitterRatio  = 0.5
	DefaultAccrualSuccessRate  = 0.8
	DefaultAccrualWindow       = 10 * time.Second
	DefaultAccrualMinRequests  = 5
	maxAccrualJitterRatio      = 100
	maxAccrualMinRequestsValue = 1 << 20
)

// The load biaser's annotations of a Service, as Linkerd's policy
// controller reads them (policy-controller, parse_load_biaser_config): with
// penalize-failures, the Service's backends use the peak-EWMA estimator
// that penalizes an endpoint answering a response that signals overload (a
// 429, a 503 or another 5xx, a Trailers-Only gRPC RESOURCE_EXHAUSTED,
// UNAVAILABLE or server error): its RTT estimate is raised to the penalty,
// or to its Retry-After when that is longer (at most max-retry-after),
// and decays (see balancer.PenaltyPeakEWMA).
const (
	AnnotationPenalizeFailures        = "balancer.alpha.linkerd.io/penalize-failures"
	AnnotationLoadBiaserPenalty       = "balancer.alpha.linkerd.io/load-biaser-penalty"
	AnnotationLoadBiaserMaxRetryAfter = "balancer.alpha.linkerd.io/load-biaser-max-retry-after"
	// AnnotationHonorRetryAfter is read and checked; it tunes the failure
	// accrual's backoff, which has no effect without a failure-accrual
	// mode (as Linkerd's controller says).
	AnnotationHonorRetryAfter = "balancer.alpha.linkerd.io/failure-accrual-honor-retry-after"
)

// Defaults of the load biaser's annotations (Linkerd's).
const (
	DefaultLoadBiaserPenalty       = 5 * time.Second
	DefaultLoadBiaserMaxRetryAfter = 300 * time.Second
	// maxLoadBiaserPenalty is the most the proxy can carry: a u32 of
	// milliseconds.
	maxLoadBiaserPenalty = time.Duration(1<<32-1) * time.Millisecond
)

// loadBiaser reads the load biaser's annotations: nil unless
// penalize-failures is true. An error names the annotation.
func loadBiaser(a map[string]string) (*policy.LoadPenalty, error) {
	if _, err := boolAnnotation(a, AnnotationHonorRetryAfter); err != nil {
		return nil, err
	}
	on, err := boolAnnotation(a, AnnotationPenalizeFailures)
	if err != nil || !on {
		return nil, err
	}
	penalty, err := durationAnnotation(a, AnnotationLoadBiaserPenalty, DefaultLoadBiaserPenalty)
	if err != nil {
		return nil, err
	}
	if penalty > maxLoadBiaserPenalty {
		return nil, annotationErr(AnnotationLoadBiaserPenalty, "%v exceeds the maximum supported value (~49.7 days)", penalty)
	}
	maxRetryAfter, err := durationAnnotation(a, AnnotationLoadBiaserMaxRetryAfter, DefaultLoadBiaserMaxRetryAfter)
	if err != nil {
		return nil, err
	}
	return &policy.LoadPenalty{Penalty: penalty, MaxRetryAfter: maxRetryAfter, PenaltyDecay: DefaultDecay}, nil
}

// boolAnnotation reads "true" or "false" (false when absent).
func boolAnnotation(a map[string]string, key string) (bool, error) {
	v, ok := a[key]
	if !ok {
		return false, nil
	}
	switch strings.TrimSpace(v) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, annotationErr(key, "%q is not true or false", v)
}

// failureAccrual reads the failure-accrual annotations: nil when
// balancer.linkerd.io/failure-accrual is not set. An error names the
// annotation.
func failureAccrual(a map[string]string) (*policy.FailureAccrual, error) {
	mode, ok := a[AnnotationFailureAccrual]
	if !ok {
		for k := range a {
			if k != AnnotationHonorRetryAfter && (strings.HasPrefix(k, "balancer.linkerd.io/failure-accrual-") || strings.HasPrefix(k, "balancer.alpha.linkerd.io/failure-accrual-")) {
				return nil, annotationErr(k, "needs %s (consecutive or unified)", AnnotationFailureAccrual)
			}
		}
		return nil, nil
	}
	mode = strings.TrimSpace(mode)
	if mode != "consecutive" && mode != "unified" {
		return nil, annotationErr(AnnotationFailureAccrual, "%q is not consecutive or unified", mode)
	}
	maxFailures, err := uintAnnotation(a, AnnotationAccrualMaxFailures, DefaultAccrualMaxFailures, 1<<31)
	if err != nil {
		return nil, err
	}
	minPen, err := durationAnnotation(a, AnnotationAccrualMinPenalty, DefaultAccrualMinPenalty)
	if err != nil {
		return nil, err
	}
	maxPen, err := durationAnnotation(a, AnnotationAccrualMaxPenalty, DefaultAccrualMaxPenalty)
	if err != nil {
		return nil, err
	}
	if minPen <= 0 {
		return nil, annotationErr(AnnotationAccrualMinPenalty, "must be more than 0")
	}
	if maxPen < minPen {
		return nil, annotationErr(AnnotationAccrualMaxPenalty, "%v is less than the minimum penalty %v", maxPen, minPen)
	}
	jitter := DefaultAccrualJitterRatio
	if v, ok := a[AnnotationAccrualJitterRatio]; ok {
		if jitter, err = strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil || !(jitter >= 0 && jitter <= maxAccrualJitterRatio) {
			return nil, annotationErr(AnnotationAccrualJitterRatio, "%q is not a number from 0 to 100", v)
		}
	}
	bo := backoff.Policy{Min: minPen, Max: maxPen, Jitter: jitter}
	if mode == "consecutive" {
		for _, k := range []string{AnnotationAccrualSuccessRate, AnnotationAccrualSuccessRateWindow, AnnotationAccrualSuccessRateRequests} {
			if _, ok := a[k]; ok {
				return nil, annotationErr(k, "applies only with %s: unified", AnnotationFailureAccrual)
			}
		}
		return &policy.FailureAccrual{Consecutive: &policy.ConsecutiveFailures{MaxFailures: uint32(maxFailures), Backoff: bo}}, nil
	}
	threshold := DefaultAccrualSuccessRate
	if v, ok := a[AnnotationAccrualSuccessRate]; ok {
		if threshold, err = strconv.ParseFloat(strings.TrimSpace(v), 64); err != nil || !(threshold >= 0 && threshold <= 1) {
			return nil, annotationErr(AnnotationAccrualSuccessRate, "%q is not a number from 0 to 1", v)
		}
	}
	window, err := durationAnnotation(a, AnnotationAccrualSuccessRateWindow, DefaultAccrualWindow)
	if err != nil {
		return nil, err
	}
	if window < 10*time.Millisecond {
		return nil, annotationErr(AnnotationAccrualSuccessRateWindow, "%v is shorter than 10ms", window)
	}
	minReq, err := uintAnnotation(a, AnnotationAccrualSuccessRateRequests, DefaultAccrualMinRequests, maxAccrualMinRequestsValue)
	if err != nil {
		return nil, err
	}
	return &policy.FailureAccrual{Unified: &policy.UnifiedAccrual{SuccessRateThreshold: threshold, Window: window,
		MinRequests: uint32(minReq), MaxConsecutiveFailures: uint32(maxFailures), Backoff: bo}}, nil
}

func uintAnnotation(a map[string]string, key string, def, max uint64) (uint64, error) {
	v, ok := a[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
	if err != nil || n > max {
		return 0, annotationErr(key, "%q is not a whole number from 0 to %d", v, max)
	}
	return n, nil
}

func durationAnnotation(a map[string]string, key string, def time.Duration) (time.Duration, error) {
	v, ok := a[key]
	if !ok {
		return def, nil
	}
	d, err := parseDuration(v)
	if err != nil {
		return 0, annotationErr(key, "%v", err)
	}
	return d, nil
}
