package router

import (
	"fmt"
	"strings"

	"github.com/inmesh/inmesh/balancer"
	"github.com/inmesh/inmesh/policy"
)

// balancerOutlier is the balancer's form of a policy backend's outlier
// detection; nil when it ejects nothing (none, neither ejection, a cap of
// 0%, or every ejection enforced 0% of the time).
func balancerOutlier(o *policy.OutlierDetection) *balancer.OutlierDetection {
	if o == nil || o.MaxEjectionPercent == 0 {
		return nil
	}
	out := &balancer.OutlierDetection{Interval: o.Interval, BaseEjectionTime: o.BaseEjectionTime,
		MaxEjectionTime: o.MaxEjectionTime, MaxEjectionPercent: o.MaxEjectionPercent}
	if s := o.SuccessRate; s != nil && s.EnforcementPercentage > 0 {
		out.SuccessRateEjection = &balancer.SuccessRateEjection{StdevFactor: s.StdevFactor,
			EnforcementPercentage: s.EnforcementPercentage, MinimumHosts: s.MinimumHosts, RequestVolume: s.RequestVolume}
	}
	if f := o.FailurePercentage; f != nil && f.EnforcementPercentage > 0 {
		out.FailurePercentageEjection = &balancer.FailurePercentageEjection{Threshold: f.Threshold,
			EnforcementPercentage: f.EnforcementPercentage, MinimumHosts: f.MinimumHosts, RequestVolume: f.RequestVolume}
	}
	if out.SuccessRateEjection == nil && out.FailurePercentageEjection == nil {
		return nil
	}
	return out
}

// outlierInfo explains an outlier detection in one line, for /routes.
func outlierInfo(o *balancer.OutlierDetection) string {
	if o == nil {
		return ""
	}
	var parts []string
	if s := o.SuccessRateEjection; s != nil {
		parts = append(parts, fmt.Sprintf("success rate below mean - %.3g stdev (enforced %d%%, >= %d endpoints of >= %d requests)",
			float64(s.StdevFactor)/1000, s.EnforcementPercentage, s.MinimumHosts, s.RequestVolume))
	}
	if f := o.FailurePercentageEjection; f != nil {
		parts = append(parts, fmt.Sprintf("failures above %d%% (enforced %d%%, >= %d endpoints of >= %d requests)",
			f.Threshold, f.EnforcementPercentage, f.MinimumHosts, f.RequestVolume))
	}
	return fmt.Sprintf("every %v: %s; ejected for %v x ejections, at most %v; at most %d%% ejected",
		o.Interval, strings.Join(parts, ", "), o.BaseEjectionTime, max(o.BaseEjectionTime, o.MaxEjectionTime), o.MaxEjectionPercent)
}
