-- The Take function: strategy.Taker on PostgreSQL, called in one statement
-- per Take. It follows strategy/memory/take.go and internal/slidelog step by
-- step; {{...}} are filled in by schema.go (names, constants, and the bucket
-- model's expressions, written once in sql.go).
--
-- Atomicity: a transaction-level advisory lock on (namespace, key) serialises
-- the Takes of one key (the first Take of a key has no rows to lock), and the
-- key's bucket and log rows are locked FOR UPDATE, in primary-key order, so a
-- push or a purge cannot change them in between. Pushes never wait for an
-- advisory lock, and lock bucket rows in the same global order; purges skip
-- locked rows: no deadlock.
--
-- Exactly once: the decision is recorded under p_id in the batch table
-- (allowed is not null), in the same transaction as its effects.
CREATE OR REPLACE FUNCTION {{fn}}(
	p_ns text, p_key text, p_id text, p_now bigint, p_cost bigint,
	p_peek boolean, p_refund boolean, p_answered integer,
	p_periods bigint[], p_intervals double precision[], p_bursts bigint[], p_bpen boolean[],
	p_windows bigint[], p_maxes bigint[], p_lpen boolean[], p_margin bigint,
	OUT r_allowed boolean, OUT r_tats bigint[], OUT r_ivs bigint[],
	OUT r_counts bigint[], OUT r_fits bigint[], OUT r_empties bigint[])
LANGUAGE plpgsql AS $fn$
DECLARE
	v_n     double precision := p_now;
	v_nb    integer := coalesce(cardinality(p_periods), 0);
	v_nl    integer := coalesce(cardinality(p_windows), 0);
	v_seen  boolean := false;
	v_rec   boolean;
	v_fits  boolean := true;
	v_mode  "char" := '-'; -- S spend, U spend unpenalized, T take back, R refund, - nothing
	v_pen   boolean;
	v_tat   double precision;
	v_iv    double precision;
	v_base  double precision;
	v_add   double precision;
	v_floor double precision;
	v_a     bigint[]; -- a log's entries: instants,
	v_c     bigint[]; -- costs
	v_d     text[];   -- and Take IDs, oldest first
	v_k     integer;
	v_j     integer;
	v_left  numeric;
	v_total numeric;
	v_fit   bigint;
	v_end   bigint := p_now + {{take_record_min}};
	i       integer;
BEGIN
	PERFORM pg_advisory_xact_lock(hashtextextended(length(p_ns) || ':' || p_ns || p_key, {{seed}}));
	IF p_id <> '' AND NOT p_peek THEN
		SELECT b.allowed INTO v_rec FROM {{batches}} b WHERE b.id = p_id;
		v_seen := FOUND;
	END IF;
	PERFORM 1 FROM {{buckets}} b WHERE b.period = ANY (p_periods) AND b.namespace = p_ns AND b.key = p_key
		ORDER BY b.period FOR UPDATE;
	PERFORM 1 FROM {{logs}} l WHERE l.window_size = ANY (p_windows) AND l.namespace = p_ns AND l.key = p_key
		ORDER BY l.window_size FOR UPDATE;
	-- Every log drops the entries that left its window (slidelog.Prune),
	-- a peek's too, as the memory store's: entries that left the window at
	-- a later instant stay gone when the next take's clock is behind.
	FOR i IN 1 .. v_nl LOOP
		UPDATE {{logs}} l SET ats = l.ats[p.k:], costs = l.costs[p.k:], ids = l.ids[p.k:]
		FROM (SELECT (count(*) + 1)::integer AS k FROM {{logs}} l2, unnest(l2.ats) x
			WHERE l2.window_size = p_windows[i] AND l2.namespace = p_ns AND l2.key = p_key AND x <= p_now - p_windows[i]) p
		WHERE l.window_size = p_windows[i] AND l.namespace = p_ns AND l.key = p_key AND p.k > 1;
	END LOOP;

	-- Does every limit admit the request? (strategy.BucketFits, slidelog.Fits)
	IF p_peek OR NOT (p_refund OR p_answered <> 0 OR v_seen) THEN
		FOR i IN 1 .. v_nb LOOP
			SELECT b.tat, b.interval INTO v_tat, v_iv FROM {{buckets}} b
			WHERE b.period = p_periods[i] AND b.namespace = p_ns AND b.key = p_key;
			-- The time the bucket owes against what the request leaves:
			-- max(tat - now, 0) <= (burst - cost) * interval. tat - now is
			-- exact; now + cost * interval would round at 1.7e12 ms.
			v_base := 0;
			IF v_iv > 0 THEN
				v_base := {{convert}} - v_n;
			END IF;
			IF v_base <= 0 THEN
				IF p_cost > p_bursts[i] THEN
					v_fits := false;
				END IF;
			ELSIF NOT (v_base <= ((p_bursts[i] - p_cost)::float8 * p_intervals[i])) THEN
				v_fits := false;
			END IF;
		END LOOP;
		FOR i IN 1 .. v_nl LOOP
			SELECT coalesce(sum(x), 0) INTO v_total FROM {{logs}} l, unnest(l.costs) x
			WHERE l.window_size = p_windows[i] AND l.namespace = p_ns AND l.key = p_key;
			IF v_total + p_cost > p_maxes[i] THEN
				v_fits := false;
			END IF;
		END LOOP;
	END IF;

	-- The decision, and what it does to the limits (memory's Store.take).
	IF p_peek THEN
		r_allowed := v_fits;
	ELSIF p_refund THEN
		r_allowed := true;
		IF NOT v_seen THEN
			v_mode := 'R';
		END IF;
	ELSIF p_answered <> 0 THEN
		r_allowed := p_answered = 1;
		IF NOT v_seen THEN
			v_mode := 'S';
		ELSIF v_rec AND NOT r_allowed THEN
			v_mode := 'T'; -- the store admitted what the node rejected
		ELSIF NOT v_rec AND r_allowed THEN
			v_mode := 'U'; -- the store rejected what the node admitted
		END IF;
	ELSIF v_seen THEN
		r_allowed := v_rec;
	ELSE
		r_allowed := v_fits;
		v_mode := 'S';
	END IF;

	-- Which limits the mode acts on, by their penalty: a spend acts on every
	-- limit when admitted and on those with a penalty when rejected; a spend
	-- of what a rejection left unspent, and a take-back of an admission, on
	-- those without one; a refund on all.
	FOR i IN 1 .. v_nb LOOP
		v_pen := p_bpen[i];
		CONTINUE WHEN NOT (CASE WHEN v_mode = 'S' THEN r_allowed OR v_pen WHEN v_mode IN ('U', 'T') THEN NOT v_pen ELSE v_mode = 'R' END);
		IF v_mode IN ('S', 'U') THEN -- strategy.SpendDiff
			v_add := p_cost::float8 * p_intervals[i];
			v_floor := v_n + v_add;
		ELSE -- strategy.RefundDiff
			v_add := -(p_cost::float8 * p_intervals[i]);
			v_floor := v_n;
		END IF;
		IF v_mode = 'R' THEN -- a refund leaves a bucket without state full
			UPDATE {{buckets}} t SET tat = {{apply}}, interval = p_intervals[i]
			WHERE t.period = p_periods[i] AND t.namespace = p_ns AND t.key = p_key AND t.interval > 0;
		ELSE
			INSERT INTO {{buckets}} AS t (namespace, key, period, tat, interval, ord)
			VALUES (p_ns, p_key, p_periods[i], greatest(v_n + v_add, v_floor), p_intervals[i], 0)
			ON CONFLICT (period, namespace, key) DO UPDATE SET tat = {{apply}}, interval = p_intervals[i];
		END IF;
	END LOOP;

	FOR i IN 1 .. v_nl LOOP
		v_pen := p_lpen[i];
		CONTINUE WHEN NOT (CASE WHEN v_mode = 'S' THEN r_allowed OR v_pen WHEN v_mode IN ('U', 'T') THEN NOT v_pen ELSE v_mode = 'R' END);
		SELECT l.ats, l.costs, l.ids INTO v_a, v_c, v_d FROM {{logs}} l
		WHERE l.window_size = p_windows[i] AND l.namespace = p_ns AND l.key = p_key;
		IF NOT FOUND THEN
			v_a := '{}'; v_c := '{}'; v_d := '{}';
		END IF;
		v_k := cardinality(v_a);
		IF v_mode IN ('S', 'U') THEN -- slidelog.Add
			IF v_k > 0 AND v_k >= 2 * greatest(p_maxes[i], 1) THEN
				v_c[v_k] := v_c[v_k] + p_cost;
				v_a[v_k] := greatest(p_now, v_a[v_k]);
			ELSE
				v_a := v_a || CASE WHEN v_k > 0 THEN greatest(p_now, v_a[v_k]) ELSE p_now END;
				v_c := v_c || p_cost;
				v_d := v_d || p_id;
			END IF;
		ELSIF v_mode = 'T' THEN -- slidelog.Remove
			v_j := array_position(v_d, p_id);
			IF v_j IS NOT NULL THEN
				v_a := v_a[:v_j - 1] || v_a[v_j + 1:];
				v_c := v_c[:v_j - 1] || v_c[v_j + 1:];
				v_d := v_d[:v_j - 1] || v_d[v_j + 1:];
			END IF;
		ELSE -- slidelog.TakeBack
			v_left := p_cost;
			WHILE v_left > 0 AND v_k > 0 LOOP
				IF v_c[v_k] > v_left THEN
					v_c[v_k] := v_c[v_k] - v_left;
					v_left := 0;
				ELSE
					v_left := v_left - v_c[v_k];
					v_k := v_k - 1;
					v_a := v_a[:v_k]; v_c := v_c[:v_k]; v_d := v_d[:v_k];
				END IF;
			END LOOP;
		END IF;
		INSERT INTO {{logs}} AS l (namespace, key, window_size, ats, costs, ids)
		VALUES (p_ns, p_key, p_windows[i], v_a, v_c, v_d)
		ON CONFLICT (window_size, namespace, key) DO UPDATE SET ats = EXCLUDED.ats, costs = EXCLUDED.costs, ids = EXCLUDED.ids;
	END LOOP;

	-- The limits' states after the take (a bucket without state reads as
	-- the zero BucketState; slidelog.State), and how long the decision must
	-- be remembered (memory's takeEnd).
	r_tats := '{}'; r_ivs := '{}';
	FOR i IN 1 .. v_nb LOOP
		SELECT b.tat, b.interval INTO v_tat, v_iv FROM {{buckets}} b
		WHERE b.period = p_periods[i] AND b.namespace = p_ns AND b.key = p_key;
		IF NOT FOUND THEN
			v_tat := 0; v_iv := 0;
		ELSIF v_iv > 0 THEN
			v_end := greatest(v_end, {{ceil_tat}} + p_periods[i] + {{retention}});
		END IF;
		r_tats := r_tats || {{bits_tat}};
		r_ivs := r_ivs || {{bits_iv}};
	END LOOP;
	r_counts := '{}'; r_fits := '{}'; r_empties := '{}';
	FOR i IN 1 .. v_nl LOOP
		v_end := greatest(v_end, p_now + p_windows[i]);
		SELECT l.ats, l.costs INTO v_a, v_c FROM {{logs}} l
		WHERE l.window_size = p_windows[i] AND l.namespace = p_ns AND l.key = p_key;
		v_k := coalesce(cardinality(v_a), 0);
		v_total := 0;
		FOR v_j IN 1 .. v_k LOOP
			v_total := v_total + v_c[v_j];
		END LOOP;
		v_fit := p_now;
		v_left := v_total;
		v_j := 1;
		WHILE v_left + p_cost > p_maxes[i] AND v_j <= v_k LOOP
			v_left := v_left - v_c[v_j];
			v_fit := greatest(p_now, v_a[v_j] + p_windows[i]);
			v_j := v_j + 1;
		END LOOP;
		r_counts := r_counts || v_total::bigint;
		r_fits := r_fits || v_fit;
		r_empties := r_empties || CASE WHEN v_k > 0 THEN greatest(p_now, v_a[v_k] + p_windows[i]) ELSE p_now END;
		IF v_k = 0 THEN
			DELETE FROM {{logs}} l WHERE l.window_size = p_windows[i] AND l.namespace = p_ns AND l.key = p_key;
		END IF;
	END LOOP;

	IF NOT p_peek AND p_id <> '' THEN
		INSERT INTO {{batches}} AS b (id, expires_at, allowed) VALUES (p_id, v_end + p_margin, r_allowed)
		ON CONFLICT (id) DO UPDATE SET allowed = EXCLUDED.allowed, expires_at = greatest(b.expires_at, EXCLUDED.expires_at);
	END IF;
END
$fn$
