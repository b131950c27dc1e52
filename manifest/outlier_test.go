package manifest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/inmesh/inmesh/policy"
)

// The outlier.inmesh.io annotations of a Service: A50's defaults for what
// they leave out (grpc-go's outlierdetection balancer_test.go
// TestParseConfig: "success-rate-ejection-present-but-no-fields",
// "...-partially-set", "failure-percentage-ejection-present-but-no-fields",
// zero values kept), and refusals that name the annotation.
func TestOutlierAnnotations(t *testing.T) {
	defSR := &policy.SuccessRateEjection{StdevFactor: 1900, EnforcementPercentage: 100, MinimumHosts: 5, RequestVolume: 100}
	defFP := &policy.FailurePercentageEjection{Threshold: 85, EnforcementPercentage: 0, MinimumHosts: 5, RequestVolume: 50}
	top := func(sr *policy.SuccessRateEjection, fp *policy.FailurePercentageEjection) *policy.OutlierDetection {
		return &policy.OutlierDetection{Interval: 10 * time.Second, BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 300 * time.Second,
			MaxEjectionPercent: 10, SuccessRate: sr, FailurePercentage: fp}
	}
	for _, tc := range []struct {
		name string
		a    map[string]string
		want *policy.OutlierDetection
		err  string
	}{
		{name: "absent"},
		{name: "success-rate-ejection-present-but-no-fields", a: map[string]string{AnnotationOutlierSuccessRate: "true"}, want: top(defSR, nil)},
		{name: "success-rate-ejection-present-partially-set",
			a:    map[string]string{AnnotationOutlierSuccessRate: "true", AnnotationOutlierSuccessRateStdevFactor: "1000", AnnotationOutlierSuccessRateMinHosts: "5"},
			want: top(&policy.SuccessRateEjection{StdevFactor: 1000, EnforcementPercentage: 100, MinimumHosts: 5, RequestVolume: 100}, nil)},
		{name: "failure-percentage-ejection-present-but-no-fields", a: map[string]string{AnnotationOutlierFailurePercent: "true"}, want: top(nil, defFP)},
		{name: "some-top-level-fields-set",
			a: map[string]string{AnnotationOutlierFailurePercent: "true", AnnotationOutlierFailureEnforcement: "100", AnnotationOutlierFailureThreshold: "10",
				AnnotationOutlierInterval: "15s", AnnotationOutlierMaxEjectionTime: "350s", AnnotationOutlierMaxEjectionPercent: "20"},
			want: &policy.OutlierDetection{Interval: 15 * time.Second, BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 350 * time.Second, MaxEjectionPercent: 20,
				FailurePercentage: &policy.FailurePercentageEjection{Threshold: 10, EnforcementPercentage: 100, MinimumHosts: 5, RequestVolume: 50}}},
		{name: "zero values are kept",
			a: map[string]string{AnnotationOutlierSuccessRate: "true", AnnotationOutlierInterval: "0s", AnnotationOutlierMaxEjectionPercent: "0",
				AnnotationOutlierSuccessRateStdevFactor: "0", AnnotationOutlierSuccessRateVolume: "0"},
			want: &policy.OutlierDetection{BaseEjectionTime: 30 * time.Second, MaxEjectionTime: 300 * time.Second,
				SuccessRate: &policy.SuccessRateEjection{EnforcementPercentage: 100, MinimumHosts: 5}}},
		{name: "both off", a: map[string]string{AnnotationOutlierSuccessRate: "false", AnnotationOutlierInterval: "1s"}, err: "outlier detection needs"},
		{name: "unknown key", a: map[string]string{"outlier.inmesh.io/consecutive-5xx": "5"}, err: "metadata.annotations.outlier.inmesh.io/consecutive-5xx: unknown"},
		{name: "not a bool", a: map[string]string{AnnotationOutlierSuccessRate: "yes"}, err: AnnotationOutlierSuccessRate},
		{name: "interval-is-negative", a: map[string]string{AnnotationOutlierSuccessRate: "true", AnnotationOutlierInterval: "-10s"}, err: AnnotationOutlierInterval},
		{name: "max-ejection-percent-is-greater-than-100", a: map[string]string{AnnotationOutlierSuccessRate: "true", AnnotationOutlierMaxEjectionPercent: "150"},
			err: AnnotationOutlierMaxEjectionPercent + `: "150" is not a whole number from 0 to 100`},
		{name: "enforcement-percentage-success-rate-is-greater-than-100", a: map[string]string{AnnotationOutlierSuccessRate: "true", AnnotationOutlierSuccessRateEnforcement: "150"},
			err: AnnotationOutlierSuccessRateEnforcement},
		{name: "failure-percentage-threshold-is-greater-than-100", a: map[string]string{AnnotationOutlierFailurePercent: "true", AnnotationOutlierFailureThreshold: "150"},
			err: AnnotationOutlierFailureThreshold},
		{name: "enforcement-percentage-failure-percentage-ejection-is-greater-than-100", a: map[string]string{AnnotationOutlierFailurePercent: "true", AnnotationOutlierFailureEnforcement: "150"},
			err: AnnotationOutlierFailureEnforcement},
		{name: "tuning without its ejection", a: map[string]string{AnnotationOutlierSuccessRate: "true", AnnotationOutlierFailureThreshold: "10"},
			err: AnnotationOutlierFailureThreshold + `: applies only with ` + AnnotationOutlierFailurePercent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := outlierDetection(tc.a)
			if tc.err != "" {
				assert.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			require.NoError(t, policy.CheckOutlierDetection(got, "od"))
		})
	}
}

// A backend Service's annotations are the outlier detection of its
// balancer in every policy that routes to it; a bad one fails its
// document.
func TestOutlierAnnotationsInPolicy(t *testing.T) {
	r := mustParse(t, `
apiVersion: v1
kind: Service
metadata:
  name: books
  namespace: default
  annotations:
    outlier.inmesh.io/failure-percentage-ejection: "true"
    outlier.inmesh.io/failure-percentage-enforcement-percentage: "100"
    outlier.inmesh.io/failure-percentage-threshold: "10"
spec: {ports: [{port: 7000}]}
`, `
apiVersion: v1
kind: Service
metadata: {name: front, namespace: default}
spec: {ports: [{port: 80}]}
`, `
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: to-books, namespace: default}
spec:
  parentRefs: [{group: core, kind: Service, name: front, port: 80}]
  rules:
  - backendRefs: [{name: books, port: 7000}, {name: front, port: 80}]
`)
	p := r.Policy("default", "books", 7000)
	b := p.HTTP1.Routes[0].Rules[0].Backends.Backends[0].Backend
	require.NotNil(t, b.Balancer.Outlier)
	assert.Equal(t, uint32(10), b.Balancer.Outlier.FailurePercentage.Threshold)
	compiles(t, p)

	p = r.Policy("default", "front", 80)
	bs := p.HTTP1.Routes[0].Rules[0].Backends.Backends
	require.NotNil(t, bs[0].Backend.Balancer.Outlier, "books keeps its outlier detection behind front's route")
	assert.Nil(t, bs[1].Backend.Balancer.Outlier, "front has none")

	_, err := Parse([]byte("apiVersion: v1\nkind: Service\nmetadata: {name: a, annotations: {outlier.inmesh.io/success-rate-ejection: \"true\", outlier.inmesh.io/max-ejection-percent: \"101\"}}\n"))
	require.ErrorContains(t, err, `document 1 (Service default/a): metadata.annotations.outlier.inmesh.io/max-ejection-percent: "101" is not a whole number from 0 to 100`)
}
