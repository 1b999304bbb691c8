package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ratesync/ratelimit/policy"
)

func cli(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func write(t *testing.T, dir, name, body string) string {
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o644))
	return p
}

func TestCLI(t *testing.T) {
	dir := t.TempDir()
	v1 := write(t, dir, "v1.yaml", "default: {limits: [{window: 1m, max: 100}]}\n")
	v2 := write(t, dir, "v2.yaml", "default: {limits: [{window: 1m, max: 200}]}\ndeny: {keys: [bad]}\n")
	bad := write(t, dir, "bad.yaml", "default: {limits: [{window: 1m, max: 0}]}\n")

	code, out, _ := cli("validate", v1, v2)
	require.Equal(t, 0, code)
	require.Contains(t, out, "v2.yaml: ok")
	code, _, errs := cli("validate", bad)
	require.Equal(t, 1, code)
	require.Contains(t, errs, "policy: line 1: default.limits[0].max: 0 would reject all traffic")

	code, out, _ = cli("diff", v1, v2)
	require.Equal(t, 0, code)
	require.Contains(t, out, `~ default: {"limits":[{"window":"1m0s","max":100}]} -> {"limits":[{"window":"1m0s","max":200}]}`)
	require.Contains(t, out, `+ deny "bad"`)

	// The same commands on a file store and on an operator handler.
	srv := httptest.NewServer(policy.NewHandler(policy.NewMemoryStore(), policy.HandlerOptions{Logger: slog.New(slog.DiscardHandler)}))
	defer srv.Close()
	for _, store := range [][]string{{"-file", filepath.Join(dir, "live.yaml")}, {"-url", srv.URL}} {
		with := func(cmd string, rest ...string) (int, string, string) {
			return cli(append(append([]string{cmd}, store...), rest...)...)
		}
		code, out, errs = with("publish", v1)
		require.Equal(t, 0, code, errs)
		require.Equal(t, "published version 1\n", out)
		code, _, errs = with("publish", bad)
		require.Equal(t, 1, code)
		require.Contains(t, errs, "not published")
		code, out, _ = with("publish", v2)
		require.Equal(t, 0, code)
		require.Equal(t, "published version 2\n", out)
		code, out, _ = with("diff", v1)
		require.Equal(t, 0, code)
		require.Contains(t, out, `- deny "bad"`)
		code, out, _ = with("rollback")
		require.Equal(t, 0, code)
		require.Equal(t, "current version 1\n", out)
		code, out, _ = with("show")
		require.Equal(t, 0, code)
		require.Contains(t, out, "current version 1; versions kept [1 2]\ndefault: {limits: [{window: 1m, max: 100}]}")
		code, out, _ = with("rollback", "-to", "2")
		require.Equal(t, 0, code, out)
		code, _, errs = with("rollback", "-to", "9")
		require.Equal(t, 1, code)
		require.Contains(t, errs, "no such version")
	}
	code, _, _ = cli("publish", v1)
	require.Equal(t, 1, code, "no store")
	code, _, _ = cli("nonsense")
	require.Equal(t, 2, code)
}
