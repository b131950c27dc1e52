package manifest

import (
	"strings"
	"time"

	"github.com/inmesh/inmesh/policy"
)

// The outlier-detection annotations of a Service (inmesh only, in the style
// of Linkerd's balancer.linkerd.io/*): they configure gRFC A50's outlier
// detection of the Service's endpoints, for every route whose backend the
// Service is. success-rate-ejection or failure-percentage-ejection ("true")
// turns an ejection on; the others tune it, with A50's defaults.
const (
	AnnotationOutlierPrefix                 = "outlier.inmesh.io/"
	AnnotationOutlierInterval               = "outlier.inmesh.io/interval"
	AnnotationOutlierBaseEjectionTime       = "outlier.inmesh.io/base-ejection-time"
	AnnotationOutlierMaxEjectionTime        = "outlier.inmesh.io/max-ejection-time"
	AnnotationOutlierMaxEjectionPercent     = "outlier.inmesh.io/max-ejection-percent"
	AnnotationOutlierSuccessRate            = "outlier.inmesh.io/success-rate-ejection"
	AnnotationOutlierSuccessRateStdevFactor = "outlier.inmesh.io/success-rate-stdev-factor"
	AnnotationOutlierSuccessRateEnforcement = "outlier.inmesh.io/success-rate-enforcement-percentage"
	AnnotationOutlierSuccessRateMinHosts    = "outlier.inmesh.io/success-rate-minimum-hosts"
	AnnotationOutlierSuccessRateVolume      = "outlier.inmesh.io/success-rate-request-volume"
	AnnotationOutlierFailurePercent         = "outlier.inmesh.io/failure-percentage-ejection"
	AnnotationOutlierFailureThreshold       = "outlier.inmesh.io/failure-percentage-threshold"
	AnnotationOutlierFailureEnforcement     = "outlier.inmesh.io/failure-percentage-enforcement-percentage"
	AnnotationOutlierFailureMinHosts        = "outlier.inmesh.io/failure-percentage-minimum-hosts"
	AnnotationOutlierFailureVolume          = "outlier.inmesh.io/failure-percentage-request-volume"
)

// Defaults of the outlier-detection annotations: gRFC A50's (note that
// A50 enforces failure-percentage ejection 0% of the time by default: set
// its enforcement percentage to use it).
const (
	DefaultOutlierInterval             = 10 * time.Second
	DefaultOutlierBaseEjectionTime     = 30 * time.Second
	DefaultOutlierMaxEjectionTime      = 300 * time.Second
	DefaultOutlierMaxEjectionPercent   = 10
	DefaultOutlierStdevFactor          = 1900
	DefaultOutlierSuccessEnforcement   = 100
	DefaultOutlierSuccessMinHosts      = 5
	DefaultOutlierSuccessVolume        = 100
	DefaultOutlierFailureThreshold     = 85
	DefaultOutlierFailureEnforcement   = 0
	DefaultOutlierFailureMinHosts      = 5
	DefaultOutlierFailureRequestVolume = 50
)

// outlierDetection reads the outlier-detection annotations: nil when
// neither ejection is on. An error names the annotation: an unknown
// outlier.inmesh.io/ key, a value out of range, or a tuning annotation
// without its ejection.
func outlierDetection(a map[string]string) (*policy.OutlierDetection, error) {
	known := map[string]bool{}
	for _, k := range []string{AnnotationOutlierInterval, AnnotationOutlierBaseEjectionTime, AnnotationOutlierMaxEjectionTime,
		AnnotationOutlierMaxEjectionPercent, AnnotationOutlierSuccessRate, AnnotationOutlierSuccessRateStdevFactor,
		AnnotationOutlierSuccessRateEnforcement, AnnotationOutlierSuccessRateMinHosts, AnnotationOutlierSuccessRateVolume,
		AnnotationOutlierFailurePercent, AnnotationOutlierFailureThreshold, AnnotationOutlierFailureEnforcement,
		AnnotationOutlierFailureMinHosts, AnnotationOutlierFailureVolume} {
		known[k] = true
	}
	set := false
	for k := range a {
		if strings.HasPrefix(k, AnnotationOutlierPrefix) {
			if !known[k] {
				return nil, annotationErr(k, "unknown outlier-detection annotation")
			}
			set = true
		}
	}
	if !set {
		return nil, nil
	}
	sr, err := boolAnnotation(a, AnnotationOutlierSuccessRate)
	if err != nil {
		return nil, err
	}
	fp, err := boolAnnotation(a, AnnotationOutlierFailurePercent)
	if err != nil {
		return nil, err
	}
	od := &policy.OutlierDetection{}
	for _, d := range []struct {
		key string
		def time.Duration
		dst *time.Duration
	}{
		{AnnotationOutlierInterval, DefaultOutlierInterval, &od.Interval},
		{AnnotationOutlierBaseEjectionTime, DefaultOutlierBaseEjectionTime, &od.BaseEjectionTime},
		{AnnotationOutlierMaxEjectionTime, DefaultOutlierMaxEjectionTime, &od.MaxEjectionTime},
	} {
		if *d.dst, err = durationAnnotation(a, d.key, d.def); err != nil {
			return nil, err
		}
		if *d.dst < 0 {
			return nil, annotationErr(d.key, "%v is negative", *d.dst)
		}
	}
	type num struct {
		key      string
		def, max uint64
		dst      *uint32
		on       bool // its ejection is on
	}
	srv, fpv := &policy.SuccessRateEjection{}, &policy.FailurePercentageEjection{}
	nums := []num{
		{AnnotationOutlierMaxEjectionPercent, DefaultOutlierMaxEjectionPercent, 100, &od.MaxEjectionPercent, true},
		{AnnotationOutlierSuccessRateStdevFactor, DefaultOutlierStdevFactor, 1 << 31, &srv.StdevFactor, sr},
		{AnnotationOutlierSuccessRateEnforcement, DefaultOutlierSuccessEnforcement, 100, &srv.EnforcementPercentage, sr},
		{AnnotationOutlierSuccessRateMinHosts, DefaultOutlierSuccessMinHosts, 1 << 31, &srv.MinimumHosts, sr},
		{AnnotationOutlierSuccessRateVolume, DefaultOutlierSuccessVolume, 1 << 31, &srv.RequestVolume, sr},
		{AnnotationOutlierFailureThreshold, DefaultOutlierFailureThreshold, 100, &fpv.Threshold, fp},
		{AnnotationOutlierFailureEnforcement, DefaultOutlierFailureEnforcement, 100, &fpv.EnforcementPercentage, fp},
		{AnnotationOutlierFailureMinHosts, DefaultOutlierFailureMinHosts, 1 << 31, &fpv.MinimumHosts, fp},
		{AnnotationOutlierFailureVolume, DefaultOutlierFailureRequestVolume, 1 << 31, &fpv.RequestVolume, fp},
	}
	for _, n := range nums {
		if _, set := a[n.key]; set && !n.on {
			on := AnnotationOutlierSuccessRate
			if strings.HasPrefix(n.key, AnnotationOutlierPrefix+"failure-") {
				on = AnnotationOutlierFailurePercent
			}
			return nil, annotationErr(n.key, "applies only with %s: \"true\"", on)
		}
		v, err := uintAnnotation(a, n.key, n.def, n.max)
		if err != nil {
			return nil, err
		}
		*n.dst = uint32(v)
	}
	if !sr && !fp {
		return nil, annotationErr(AnnotationOutlierSuccessRate, "outlier detection needs %s or %s: \"true\"", AnnotationOutlierSuccessRate, AnnotationOutlierFailurePercent)
	}
	if sr {
		od.SuccessRate = srv
	}
	if fp {
		od.FailurePercentage = fpv
	}
	return od, nil
}

// withOutliers gives every balancer backend of p the outlier detection of
// its own Service's annotations (a backend Service the resources do not
// hold, or without them: none).
func (r *Resources) withOutliers(p *policy.Policy) {
	if p == nil {
		return
	}
	dist := func(d *policy.Distribution) {
		for i := range d.Backends {
			b := &d.Backends[i].Backend
			if b.Balancer == nil {
				continue
			}
			svc := r.Service(b.Meta.Namespace, b.Meta.Name)
			if svc == nil {
				continue
			}
			if od, _ := outlierDetection(svc.Annotations); od != nil {
				bl := *b.Balancer // the backends may share one Balancer
				bl.Outlier = od
				b.Balancer = &bl
			}
		}
	}
	for _, hp := range []*policy.HTTPProtocol{&p.HTTP1, &p.HTTP2} {
		for i := range hp.Routes {
			for j := range hp.Routes[i].Rules {
				dist(&hp.Routes[i].Rules[j].Backends)
			}
		}
	}
	for i := range p.GRPC.Routes {
		for j := range p.GRPC.Routes[i].Rules {
			dist(&p.GRPC.Routes[i].Rules[j].Backends)
		}
	}
	for i := range p.Opaque.Routes {
		dist(&p.Opaque.Routes[i].Backends)
	}
}
