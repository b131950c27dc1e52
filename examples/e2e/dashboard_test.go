package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/inmesh/inmesh/dashboard"
	"github.com/inmesh/inmesh/examples/internal/booksapp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chromium returns the path of a headless-capable Chromium: skipped where
// it is missing, a failure in CI, which installs it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("chromium is not installed")
	}
	t.Skip("chromium is not installed")
	return ""
}

// dashboardState reads the proxy's dashboard data.
func dashboardState(t *testing.T, admin string) dashboard.State {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/dashboard/state.json")
	require.NoError(t, err)
	defer resp.Body.Close()
	var s dashboard.State
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	return s
}

func routeRequests(s dashboard.State, direction, route string) uint64 {
	for _, r := range s.Routes {
		if r.Direction == direction && r.Route == route {
			return r.Requests
		}
	}
	return 0
}

// The proxy's dashboard in a real browser: the page shows the route and
// the endpoint the traffic went through, with the count of requests sent;
// a tap started from the page shows requests as they are sent. The
// screenshots go to $INMESH_SCREENSHOTS when set (the README's come from
// there), else to the test's temporary folder.
func TestDashboardInABrowser(t *testing.T) {
	browser := chromium(t)
	bin := build(t)
	dir := t.TempDir()
	profiles := filepath.Join(dir, "profiles")
	require.NoError(t, os.Mkdir(profiles, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(profiles, "books.yaml"), []byte(profile("")), 0o644))
	app := httptest.NewServer(booksapp.Handler(5 * time.Second))
	defer app.Close()
	appAddr := strings.TrimPrefix(app.URL, "http://")
	endpoints := filepath.Join(dir, "endpoints.yaml")
	require.NoError(t, os.WriteFile(endpoints, []byte("[]\n"), 0o644))
	dst := start(t, filepath.Join(bin, "destination"), nil, "-listen", "127.0.0.1:0", "-profiles", profiles, "-endpoints", endpoints, "-interval", "100ms")
	dstAddr := dst.waitLog(t, dstAddrRe)
	_, _, bIn, _ := startProxy(t, bin, dstAddr, appAddr)
	require.NoError(t, os.WriteFile(endpoints, []byte(fmt.Sprintf("- authority: %s\n  endpoints:\n  - addr: %s\n    h2: true\n", books, bIn)), 0o644))
	dst.waitLog(t, loadedEndpointsRe)
	_, aOut, _, aAdmin := startProxy(t, bin, dstAddr, appAddr)

	client := &http.Client{Timeout: timeout}
	try := func(path string) error {
		req, err := http.NewRequest(http.MethodGet, "http://"+aOut+path, nil)
		if err != nil {
			return err
		}
		req.Host = books
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: status %d", path, resp.StatusCode)
		}
		return nil
	}
	send := func(path string) { require.NoError(t, try(path)) }
	const route = "GET /books/{id}"
	// The page, then the profile's route (the dashboard counts from the
	// proxy's start).
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(browser), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 1000))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	ctx, cancel := context.WithTimeout(bctx, 2*time.Minute)
	defer cancel()
	page := "http://" + aAdmin + "/dashboard/"
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("#routes"))))
	var last error
	if !assert.Eventually(t, func() bool {
		last = try("/books/1")
		return routeRequests(dashboardState(t, aAdmin), "outbound", route) > 0
	}, timeout, 50*time.Millisecond) {
		t.Fatalf("the profile's route never showed: last request: %v; routes %+v", last, dashboardState(t, aAdmin).Routes)
	}

	before := routeRequests(dashboardState(t, aAdmin), "outbound", route)
	const n = 30
	for i := range n {
		send("/books/" + strconv.Itoa(i))
	}
	want := strconv.FormatUint(before+n, 10)
	// The routes table shows the route with every request sent, and the
	// endpoints table proxy B, ready.
	rowOf := func(table, text string) string {
		return fmt.Sprintf(`[...document.querySelectorAll("#%s tbody tr")].map(r => r.innerText).find(t => t.includes(%q)) || ""`, table, text)
	}
	poll := func(expr string) error {
		_, err := chromedp.Run(ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(timeout)))
		return err
	}
	require.NoError(t, poll(rowOf("routes", route)+`.includes("`+want+`")`),
		"the page never showed %s requests on %s", want, route)
	row, err := chromedp.Run(ctx, chromedp.Evaluate[string](rowOf("routes", route)))
	require.NoError(t, err)
	require.Contains(t, row, books)
	require.Contains(t, row, "outbound")
	require.NoError(t, poll(rowOf("endpoints", bIn)+`.includes("ready")`),
		"the page never showed endpoint %s ready", bIn)

	shots := os.Getenv("INMESH_SCREENSHOTS")
	if shots == "" {
		shots = t.TempDir()
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(shots, "dashboard.png"), png, 0o644))

	// A tap from the page, filtered to a path prefix: the requests sent
	// after it runs appear, the others do not.
	require.NoError(t, chromedp.Do(ctx,
		chromedp.SendKeys(chromedp.CSS(`#tap-form input[name="path"]`), "/books/tap"),
		chromedp.Click(chromedp.CSS("#tap-start"))))
	require.NoError(t, poll(`document.getElementById("tap-state").textContent === "running"`))
	for i := range 5 {
		send("/books/" + strconv.Itoa(100+i))
		send("/books/tap-" + strconv.Itoa(i))
	}
	require.NoError(t, poll(rowOf("tap", "/books/tap-4")+` !== ""`),
		"the tap never showed the requests")
	rows, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#tap tbody tr")].map(r => r.innerText)`))
	require.NoError(t, err)
	require.Len(t, rows, 5, "only the requests the filter names: %q", rows)
	for _, r := range rows {
		require.Contains(t, r, "/books/tap-")
		require.Contains(t, r, "200")
	}
	png, err = chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(shots, "tap.png"), png, 0o644))
}
