package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratesync/ratelimit/policy"
)

// httpStore is a policy.Store over an operator handler (policy.NewHandler):
// the server validates again what the CLI publishes, with its own Check.
type httpStore struct {
	base string
}

var client = &http.Client{Timeout: 30 * time.Second}

func (h *httpStore) url(path string) string { return strings.TrimSuffix(h.base, "/") + path }

// do sends a request and decodes a JSON answer into out, or turns a problem
// report into an error (wrapping policy.ErrInvalid or ErrNoVersion as the
// status says).
func (h *httpStore) do(ctx context.Context, method, path string, body []byte, out any) (*http.Response, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, h.url(path), bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, policy.MaxDocumentSize+1))
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode >= 300 {
		var p policy.Problem
		_ = json.Unmarshal(data, &p)
		msg := p.Detail
		if msg == "" {
			msg = strings.TrimSpace(string(data))
		}
		switch resp.StatusCode {
		case http.StatusUnprocessableEntity:
			return nil, nil, fmt.Errorf("%w: %s", policy.ErrInvalid, msg)
		case http.StatusNotFound:
			return nil, nil, fmt.Errorf("%w: %s", policy.ErrNoVersion, msg)
		}
		return nil, nil, fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, msg)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return resp, data, nil
}

func (h *httpStore) Current(ctx context.Context) (int64, error) {
	var v struct{ Current int64 }
	_, _, err := h.do(ctx, "GET", "/versions", nil, &v)
	return v.Current, err
}

func (h *httpStore) Get(ctx context.Context, n int64) (policy.Version, error) {
	_, data, err := h.do(ctx, "GET", "/versions/"+strconv.FormatInt(n, 10), nil, nil)
	return policy.Version{Number: n, Doc: data}, err
}

func (h *httpStore) Versions(ctx context.Context) ([]int64, error) {
	var v struct{ Versions []int64 }
	_, _, err := h.do(ctx, "GET", "/versions", nil, &v)
	return v.Versions, err
}

func (h *httpStore) Append(ctx context.Context, doc []byte) (int64, error) {
	var v struct{ Version int64 }
	_, _, err := h.do(ctx, "PUT", "/", doc, &v)
	return v.Version, err
}

func (h *httpStore) SetCurrent(ctx context.Context, n int64) error {
	_, _, err := h.do(ctx, "POST", "/rollback?to="+strconv.FormatInt(n, 10), nil, nil)
	return err
}

func (h *httpStore) Subscribe(context.Context) (<-chan struct{}, error) { return nil, nil }
