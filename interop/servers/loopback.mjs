// Preload (`node --import ./loopback.mjs server.js`): a server that listens on a
// port without naming a host (e.g. express's `app.listen(PORT)`, which binds every
// interface) listens on 127.0.0.1 instead. interop/run.sh starts
// @modelcontextprotocol/server-everything's Streamable HTTP mode with it, so the
// test server is reachable from this machine only. Calls that name a host, a path
// or an options object are left alone.
import net from 'node:net';

const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
    const port = args[0];
    const isPort = typeof port === 'number' || (typeof port === 'string' && /^\d+$/.test(port));
    if (isPort && typeof args[1] !== 'string') args.splice(1, 0, '127.0.0.1');
    return listen.apply(this, args);
};
