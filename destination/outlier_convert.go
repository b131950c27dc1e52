package destination

import (
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/inmesh/inmesh/policy"
	"github.com/inmesh/inmesh/proxyapi/outlierpb"
)

// outlierFromProto converts inmesh's outlier detection (field 1003 of a
// Backend.BalanceP2c); nil for none. An error names the field.
func outlierFromProto(o *outlierpb.OutlierDetection, path string) (*policy.OutlierDetection, error) {
	if o == nil {
		return nil, nil
	}
	out := &policy.OutlierDetection{MaxEjectionPercent: o.GetMaxEjectionPercent()}
	for _, f := range []struct {
		name string
		d    *durationpb.Duration
		dst  *int64
	}{
		{"interval", o.GetInterval(), (*int64)(&out.Interval)},
		{"base_ejection_time", o.GetBaseEjectionTime(), (*int64)(&out.BaseEjectionTime)},
		{"max_ejection_time", o.GetMaxEjectionTime(), (*int64)(&out.MaxEjectionTime)},
	} {
		if f.d == nil {
			continue
		}
		d, err := durationFromProto(f.d, path+"."+f.name)
		if err != nil {
			return nil, err
		}
		*f.dst = int64(d)
	}
	if s := o.GetSuccessRateEjection(); s != nil {
		out.SuccessRate = &policy.SuccessRateEjection{StdevFactor: s.GetStdevFactor(), EnforcementPercentage: s.GetEnforcementPercentage(),
			MinimumHosts: s.GetMinimumHosts(), RequestVolume: s.GetRequestVolume()}
	}
	if f := o.GetFailurePercentageEjection(); f != nil {
		out.FailurePercentage = &policy.FailurePercentageEjection{Threshold: f.GetThreshold(), EnforcementPercentage: f.GetEnforcementPercentage(),
			MinimumHosts: f.GetMinimumHosts(), RequestVolume: f.GetRequestVolume()}
	}
	if err := policy.CheckOutlierDetection(out, path); err != nil {
		return nil, err
	}
	return out, nil
}

// outlierToProto encodes o; nil for none.
func outlierToProto(o *policy.OutlierDetection) *outlierpb.OutlierDetection {
	if o == nil {
		return nil
	}
	out := &outlierpb.OutlierDetection{Interval: durationpb.New(o.Interval), BaseEjectionTime: durationpb.New(o.BaseEjectionTime),
		MaxEjectionTime: durationpb.New(o.MaxEjectionTime), MaxEjectionPercent: o.MaxEjectionPercent}
	if s := o.SuccessRate; s != nil {
		out.SuccessRateEjection = &outlierpb.OutlierDetection_SuccessRateEjection{StdevFactor: s.StdevFactor,
			EnforcementPercentage: s.EnforcementPercentage, MinimumHosts: s.MinimumHosts, RequestVolume: s.RequestVolume}
	}
	if f := o.FailurePercentage; f != nil {
		out.FailurePercentageEjection = &outlierpb.OutlierDetection_FailurePercentageEjection{Threshold: f.Threshold,
			EnforcementPercentage: f.EnforcementPercentage, MinimumHosts: f.MinimumHosts, RequestVolume: f.RequestVolume}
	}
	return out
}
