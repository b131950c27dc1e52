package inmesh

import (
	"os"
	"strings"
	"testing"
)

// The library's module carries only what its packages need: the
// Prometheus exporter and client, otelhttp and the examples' other
// dependencies stay in the examples module (their tests scrape through the
// real exporter), so that importing one inmesh package brings none of them.
func TestLibraryModuleDependencies(t *testing.T) {
	data, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, forbidden := range []string{
		"github.com/prometheus/",
		"go.opentelemetry.io/otel/exporters/prometheus",
		"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp",
		"google.golang.org/grpc/interop",
		"golang.org/x/oauth2",
	} {
		if strings.Contains(string(data), forbidden) {
			t.Errorf("go.mod requires %s, which only the examples module may", forbidden)
		}
	}
}
