package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestService: the levels the startup message promises, then the policy
// changed while serving: through the operator API, by editing the file, and
// rolled back; a bad document is refused.
func TestService(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	path := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(path, []byte(starter), 0o644))
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	svc, err := newService(context.Background(), path, "tok", func() time.Time { return now }, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	defer svc.Close()
	srv := httptest.NewServer(svc)
	defer srv.Close()

	do := func(method, path, key, tier, body string, hdr ...string) (int, string) {
		req, err := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("X-API-Key", key)
		req.Header.Set("X-Tier", tier)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	hit := func(n int, key, tier string) (ok int) {
		for range n {
			if code, _ := do("GET", "/hello", key, tier, ""); code == 200 {
				ok++
			}
		}
		return ok
	}
	admin := []string{"Authorization", "Bearer tok"}

	require.Equal(t, 5, hit(6, "alice", "free")) // one 429: not yet a strike
	require.Equal(t, 10, hit(12, "bob", ""))
	require.Equal(t, 0, hit(3, "sk_revoked_1", "pro"))
	require.Equal(t, 30, hit(30, "sk_internal_ci", ""))
	require.Equal(t, 12, hit(12, "sk_vip", "free"))
	for range 5 {
		code, _ := do("GET", "/search", "carol", "", "")
		require.Equal(t, 200, code, "the shadow rule never rejects")
	}
	require.EqualValues(t, 2, svc.limiter.Stats().ShadowRejected)

	// Through the operator API: free 5 -> 8; alice keeps what she spent.
	code, _ := do("PUT", "/admin/policy/", "", "", strings.Replace(starter, "max: 5}", "max: 8}", 1))
	require.Equal(t, http.StatusUnauthorized, code)
	code, body := do("PUT", "/admin/policy/", "", "", strings.Replace(starter, "max: 5}", "max: 8}", 1), admin...)
	require.Equal(t, http.StatusCreated, code, body)
	waitVersion(t, svc, 2)
	require.Equal(t, 3, hit(5, "alice", "free"))

	// A bad document is refused; version 2 keeps serving.
	code, body = do("PUT", "/admin/policy/", "", "", strings.Replace(starter, "max: 5}", "max: 0}", 1), admin...)
	require.Equal(t, http.StatusUnprocessableEntity, code)
	require.Contains(t, body, "would reject all traffic")
	require.EqualValues(t, 2, svc.watcher.Stats().Version)

	// Editing the file: sk_vip loses its override and is denied instead.
	edited := strings.Replace(strings.Replace(starter, "sk_vip: {limits: [{window: 1m, max: 50}]}", "{}", 1), `["sk_revoked_*"]`, `["sk_revoked_*", "sk_vip"]`, 1)
	edited = strings.Replace(edited, "overrides:\n  {}", "", 1)
	require.NoError(t, os.WriteFile(path, []byte(edited), 0o644))
	waitVersion(t, svc, 3)
	require.Equal(t, 0, hit(2, "sk_vip", "free"))

	// Roll back to version 2.
	code, body = do("POST", "/admin/policy/rollback", "", "", "", admin...)
	require.Equal(t, http.StatusOK, code, body)
	waitVersion(t, svc, 2)
	require.Equal(t, 2, hit(2, "sk_vip", "free"))
}

// waitVersion waits for the watcher to enforce v: at once for the operator
// API (the store notifies), within a poll (1 s) for a file edit.
func waitVersion(t *testing.T, svc *service, v int64) {
	t.Helper()
	require.Eventually(t, func() bool { return svc.watcher.Stats().Version == v }, 5*time.Second, 5*time.Millisecond,
		"stats %+v", svc.watcher.Stats())
}
