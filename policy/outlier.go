package policy

import (
	"fmt"
	"time"
)

// OutlierDetection ejects a balancer backend's endpoints whose success rate
// over an interval is an outlier among their peers: gRFC A50's
// configuration, every value resolved (a zero is a zero). The balancer's
// OutlierDetection documents the semantics; inmesh carries it as field
// 1003 of the OutboundPolicies balancer, from a Service's
// outlier.inmesh.io/* annotations.
type OutlierDetection struct {
	Interval, BaseEjectionTime, MaxEjectionTime time.Duration
	MaxEjectionPercent                          uint32
	// SuccessRate, when not nil, ejects an endpoint whose success rate is
	// below the mean of its peers' by StdevFactor/1000 standard deviations.
	SuccessRate *SuccessRateEjection
	// FailurePercentage, when not nil, ejects an endpoint whose failures
	// are above Threshold percent of its requests.
	FailurePercentage *FailurePercentageEjection
}

// SuccessRateEjection is A50's success_rate_ejection.
type SuccessRateEjection struct {
	StdevFactor, EnforcementPercentage, MinimumHosts, RequestVolume uint32
}

// FailurePercentageEjection is A50's failure_percentage_ejection.
type FailurePercentageEjection struct {
	Threshold, EnforcementPercentage, MinimumHosts, RequestVolume uint32
}

// CheckOutlierDetection checks o as grpc-go's outlier-detection config
// parser does: durations >= 0, percentages <= 100. A nil one is valid.
// path prefixes the field names in errors.
func CheckOutlierDetection(o *OutlierDetection, path string) error {
	if o == nil {
		return nil
	}
	type field struct {
		name string
		v    int64
		max  int64 // 0: a duration, >= 0
	}
	fs := []field{{"interval", int64(o.Interval), 0}, {"baseEjectionTime", int64(o.BaseEjectionTime), 0},
		{"maxEjectionTime", int64(o.MaxEjectionTime), 0}, {"maxEjectionPercent", int64(o.MaxEjectionPercent), 100}}
	if s := o.SuccessRate; s != nil {
		fs = append(fs, field{"successRate.enforcementPercentage", int64(s.EnforcementPercentage), 100})
	}
	if f := o.FailurePercentage; f != nil {
		fs = append(fs, field{"failurePercentage.threshold", int64(f.Threshold), 100},
			field{"failurePercentage.enforcementPercentage", int64(f.EnforcementPercentage), 100})
	}
	for _, f := range fs {
		switch {
		case f.max == 0 && f.v < 0:
			return fmt.Errorf("%s.%s: %v is negative", path, f.name, time.Duration(f.v))
		case f.max > 0 && f.v > f.max:
			return fmt.Errorf("%s.%s: %d is more than %d", path, f.name, f.v, f.max)
		}
	}
	return nil
}
