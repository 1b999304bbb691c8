package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// get sends n requests to path and returns the status codes.
func get(t *testing.T, url, path string, n int) []int {
	t.Helper()
	var codes []int
	for range n {
		resp, err := http.Get(url + path)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		codes = append(codes, resp.StatusCode)
	}
	return codes
}

func TestStdoutExport(t *testing.T) {
	var out bytes.Buffer
	svc, err := newService("stdout", time.Hour, &out)
	require.NoError(t, err)
	srv := httptest.NewServer(svc.handler)
	codes := get(t, srv.URL, "/search", 7)
	require.Equal(t, []int{200, 200, 200, 200, 200, 429, 429}, codes)
	srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(t, svc.close(ctx)) // the shutdown exports once more
	printed := out.String()
	for _, name := range []string{`"ratelimit.decisions"`, `"ratelimit.decision.duration"`, `"ratelimit.retry_after"`, `"search"`} {
		require.Contains(t, printed, name)
	}
}

func TestPrometheusExport(t *testing.T) {
	svc, err := newService("prometheus", 0, nil)
	require.NoError(t, err)
	srv := httptest.NewServer(svc.handler)
	defer srv.Close()
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		require.NoError(t, svc.close(ctx))
	}()
	require.Equal(t, []int{200, 200, 200, 200, 200, 429}, get(t, srv.URL, "/search", 6))
	// Scrapes spend no quota: the limit of 3 per second would refuse the fourth.
	var body string
	for range 4 {
		resp, err := http.Get(srv.URL + "/metrics")
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		_ = resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode)
		body = string(b)
	}
	var decisions []string
	for line := range strings.Lines(body) {
		if strings.HasPrefix(line, "ratelimit_decisions") {
			decisions = append(decisions, strings.TrimSpace(line))
		}
	}
	require.NotEmpty(t, decisions, "no ratelimit_decisions series in:\n%s", body)
	require.Contains(t, strings.Join(decisions, "\n"), `decision="rejected"`)
}

func TestUnknownExport(t *testing.T) {
	_, err := newService("statsd", 0, nil)
	require.ErrorContains(t, err, "want stdout or prometheus")
}
