--
-- egress: URL forms against outbox.allowed_hosts (the relay's check,
-- through outbox._host_allowed; NULL means the relay would send)
--
-- (libcurl's own words for a URL it cannot parse differ between 7.x and
-- 8.x, so they are shown as one phrase)
CREATE FUNCTION egress(url text, allowed text, resolved inet DEFAULT NULL)
RETURNS text LANGUAGE sql AS $$
    SELECT CASE
             WHEN r IS NULL THEN 'allowed'
             WHEN r LIKE 'could not parse destination URL:%'
               THEN 'could not parse destination URL'
             ELSE r
           END
      FROM outbox._host_allowed(url, allowed, resolved) AS r
$$;

-- userinfo is not the host: the host is what follows '@'
SELECT u, egress(u, 'allowed.test') FROM (VALUES
    ('http://allowed.test/'),
    ('http://allowed.test@other.test/'),
    ('http://user:allowed.test@other.test/'),
    ('http://other.test@allowed.test/'),
    ('http://allowed.test%40other.test/'),
    ('http://allowed.test#@other.test/'),
    ('http://allowed.test?@other.test/'),
    ('http://other.test\@allowed.test/')) v(u);

-- case and one trailing dot; names are not suffixes of each other
SELECT u, egress(u, 'Allowed.Test') FROM (VALUES
    ('http://ALLOWED.test/'),
    ('http://allowed.test./'),
    ('http://.allowed.test/'),
    ('http://evil-allowed.test/'),
    ('http://allowed.test.evil.test/'),
    ('http://sub.allowed.test/'),
    ('http://allow%65d.test/'),
    ('http://bücher.test/')) v(u);

-- two trailing dots: refused (libcurl 8 cannot parse it, 7.88 passes it
-- on and the name is not on the list)
SELECT egress('http://allowed.test../', 'allowed.test') <> 'allowed' AS double_dot_refused;

-- IPv4 in decimal, octal, hex and short forms is the address it names
SELECT u, egress(u, '127.0.0.1') FROM (VALUES
    ('http://127.0.0.1/'),
    ('http://127.0.0.1./'),
    ('http://2130706433/'),
    ('http://0177.0.0.1/'),
    ('http://0x7f.1/'),
    ('http://0x7f000001/'),
    ('http://127.1/'),
    ('http://127.0.0.2/'),
    ('http://[::ffff:127.0.0.1]/'),
    ('http://[::ffff:7f00:1]/'),
    ('http://localhost/'),
    ('http://4294967297/')) v(u);

-- entries are canonical too
SELECT egress('http://127.0.0.1/', '0x7f.1') AS hex_entry,
       egress('http://[::1]/', '0:0:0::1') AS long_v6_entry,
       egress('http://127.0.0.1/', '::ffff:127.0.0.1') AS mapped_entry,
       egress('http://localhost/', '127.0.0.1') AS name_vs_address,
       egress('http://127.0.0.1/', 'localhost') AS address_vs_name;

-- IPv6 literals compare in canonical form; zone ids are refused
SELECT u, egress(u, '::1, fd00::1') FROM (VALUES
    ('http://[::1]/'),
    ('http://[0:0:0:0:0:0:0:1]/'),
    ('http://[0000::0001]:8080/'),
    ('http://[FD00:0::1]/'),
    ('http://[::2]/'),
    ('http://[fe80::1%25lo]/'),
    ('http://[::1/'),
    ('http://::1/')) v(u);

-- ports: an entry with a port allows that port only
SELECT u, egress(u, 'allowed.test:8443, 127.0.0.1:9000, [::1]:9001') FROM (VALUES
    ('https://allowed.test:8443/'),
    ('https://allowed.test/'),
    ('http://allowed.test:8443/'),
    ('http://127.0.0.1:9000/'),
    ('http://0x7f.1:9000/'),
    ('http://127.0.0.1:9001/'),
    ('http://[::1]:9001/'),
    ('http://[::1]:9000/')) v(u);

-- CIDR blocks, wildcards
SELECT u, egress(u, '127.0.0.0/8, fd00::/16, *.svc.test') FROM (VALUES
    ('http://127.200.3.4/'),
    ('http://2130706433/'),
    ('http://128.0.0.1/'),
    ('http://[fd00:1234::5]/'),
    ('http://[fd01::5]/'),
    ('http://a.svc.test/'),
    ('http://a.b.svc.test./'),
    ('http://svc.test/'),
    ('http://asvc.test/')) v(u);

-- link-local and cloud metadata addresses: refused unless listed as addresses
CREATE FUNCTION verdict(url text, allowed text) RETURNS text LANGUAGE sql AS $$
    SELECT CASE WHEN r IS NULL THEN 'allowed'
                WHEN r LIKE '%link-local or a cloud metadata%' THEN 'refused: sensitive'
                ELSE 'refused: not listed' END
      FROM outbox._host_allowed(url, allowed) r
$$;
SELECT u, verdict(u, '') AS empty_list, verdict(u, '*') AS any_host,
       verdict(u, '169.254.169.254, fd00:ec2::254') AS named,
       verdict(u, '169.254.0.0/16') AS cidr
  FROM (VALUES
    ('http://169.254.169.254/latest/meta-data/'),
    ('http://2852039166/'),
    ('http://0xa9.0xfe.0xa9.0xfe/'),
    ('http://0251.0376.0251.0376/'),
    ('http://169.254.169.254./'),
    ('http://[::ffff:169.254.169.254]/'),
    ('http://[::ffff:a9fe:a9fe]/'),
    ('http://[64:ff9b::a9fe:a9fe]/'),
    ('http://[fd00:ec2::254]/'),
    ('http://[fe80::1]/'),
    ('http://169.254.1.1/'),
    ('http://100.100.100.200/')) v(u);
SELECT egress('http://0xa9fea9fe/', '') AS hex_metadata,
       egress('http://[::ffff:a9fe:a9fe]/', '*') AS mapped_metadata;

-- a name that resolves to such an address is refused too; the resolved
-- address must be allowed when the URL was allowed as an address
SELECT u, a, egress(u, l, a::inet) FROM (VALUES
    ('http://meta.test/', 'meta.test', '169.254.169.254'),
    ('http://meta.test/', 'meta.test', '::ffff:169.254.169.254'),
    ('http://meta.test/', 'meta.test', 'fd00:ec2::254'),
    ('http://meta.test/', 'meta.test', 'fe80::1'),
    ('http://meta.test/', 'meta.test, 169.254.169.254', '169.254.169.254'),
    ('http://meta.test/', '', '169.254.169.254'),
    ('http://meta.test/', '*', '169.254.169.254'),
    ('http://meta.test/', '*', '10.1.2.3'),
    ('http://sink.test/', 'sink.test', '127.0.0.2'),
    ('http://127.0.0.1./', '127.0.0.1', '127.0.0.1'),
    ('http://127.0.0.1./', '127.0.0.1', '10.0.0.1'),
    ('http://127.0.0.1:9000/', '127.0.0.1:9000', '127.0.0.1'),
    ('http://[::1]/', '::1', '::1')) v(u, l, a);

-- schemes and unparsable URLs
SELECT u, egress(u, '*') FROM (VALUES
    ('ftp://allowed.test/'),
    ('file:///etc/passwd'),
    ('gopher://allowed.test/'),
    ('http://a b/'),
    ('http://allowed.test:99999/'),
    ('allowed.test/path')) v(u);

-- bad lists are refused with the entry named
CREATE FUNCTION try_detail(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    d text;
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS d = PG_EXCEPTION_DETAIL;
    RETURN SQLSTATE || ': ' || SQLERRM || coalesce(' / ' || nullif(d, ''), '');
END
$$;
SELECT l, try_detail(format('SELECT outbox._host_allowed(%L, %L)', 'http://a/', l)) FROM (VALUES
    ('a,,b'), ('http://a.test/'), ('127.0.0.1/33'), ('127.0.0.1/8'),
    ('a.test:0'), ('a.test:http'), ('[::1'), ('fe80::1%eth0'), ('a b'),
    ('*.'), ('x*.test'), ('bücher.test')) v(l);
SELECT try($$SELECT outbox._host_allowed(NULL, '')$$);

-- the setting is checked when it is set
ALTER SYSTEM SET outbox.allowed_hosts = 'a.test, http://b.test/';
ALTER SYSTEM SET outbox.allowed_hosts = '127.0.0.0/8, [::1]:8080, *.svc.test, *';
ALTER SYSTEM RESET outbox.allowed_hosts;

-- not for everyone
SELECT has_function_privilege('pg_monitor', 'outbox._host_allowed(text, text, inet)', 'EXECUTE') AS monitor_may;

DROP FUNCTION egress(text, text, inet);
DROP FUNCTION try_detail(text);
DROP FUNCTION verdict(text, text);
