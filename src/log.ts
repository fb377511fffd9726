import pino from 'pino';

export type Logger = pino.Logger;

/**
 * Structured logs, quiet by default (`info` for the daemon, `warn` elsewhere).
 * Nothing logged may carry a secret: log hosts, sizes, statuses and trace names, never header values or bodies.
 */
export function createLogger(options: { level?: string; destination?: NodeJS.WritableStream | number } = {}): Logger {
  const level = options.level ?? process.env.MITM_REPLAY_LOG_LEVEL ?? 'info';
  const destination = options.destination ?? 2;
  const stream = typeof destination === 'number' ? pino.destination({ fd: destination, sync: false }) : destination;
  return pino({ level, base: { name: 'mitm-replay' } }, stream);
}
