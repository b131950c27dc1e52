// Package telemetry sets up the OpenTelemetry SDK and Prometheus exporter of
// the example programs: Linkerd's series names, and a cardinality limit that
// matches the library's own bounds, so that no series is folded into
// otel_metric_overflow while the library still labels it, and nothing a
// client sends grows the exporter past that limit.
package telemetry

import (
	"net/http"

	"github.com/inmesh/inmesh/router"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/otlptranslator"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
)

// SeriesPerAuthority is the room the limit leaves for each authority the
// library labels: the most series one family has for one authority (the
// balancer's p2c_updates_total, by op: Reset, Add, Remove, DoesNotExist).
const SeriesPerAuthority = 4

// CardinalityLimit returns the series limit per instrument for a mesh whose
// layers label up to maxAuthorities authorities (<= 0:
// router.DefaultMaxAuthorities), plus two fixed values: "other" past the
// bound, and the balancer's labels of an authority that is not a
// Service's. The route_* families carry one dst per authority, the other
// families at most SeriesPerAuthority series an authority.
func CardinalityLimit(maxAuthorities int) int {
	if maxAuthorities <= 0 {
		maxAuthorities = router.DefaultMaxAuthorities
	}
	return SeriesPerAuthority * (maxAuthorities + 2)
}

// Metrics is a MeterProvider, the Prometheus registry its exporter fills
// and the /metrics handler that serves it.
type Metrics struct {
	Provider *sdkmetric.MeterProvider
	Registry *prometheus.Registry
	Handler  http.Handler
}

// New returns the provider and handler for a mesh labelling up to
// maxAuthorities authorities (see [CardinalityLimit]); readers are added to
// the Prometheus exporter (the mesh demo reads its table from a
// ManualReader). Shut the provider down when done.
func New(maxAuthorities int, readers ...sdkmetric.Reader) (*Metrics, error) {
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(
		otelprom.WithRegisterer(registry),
		// No _milliseconds or extra _total suffixes: the names are Linkerd's already.
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithoutSuffixes),
		otelprom.WithoutScopeInfo(),
		otelprom.WithoutTargetInfo(),
	)
	if err != nil {
		return nil, err
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exporter), sdkmetric.WithCardinalityLimit(CardinalityLimit(maxAuthorities)),
		// The examples trace nothing, so no exemplar is ever kept; with
		// the filter off the SDK allocates no reservoir per series (some
		// 7 KiB per histogram series otherwise, 20 MiB over 3,000
		// authorities).
		sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter)}
	for _, r := range readers {
		if r != nil {
			opts = append(opts, sdkmetric.WithReader(r))
		}
	}
	return &Metrics{
		Provider: sdkmetric.NewMeterProvider(opts...),
		Registry: registry,
		Handler:  promhttp.HandlerFor(registry, promhttp.HandlerOpts{}),
	}, nil
}
