// The page's own functions for Realtime function calling, run in the browser.
//
// One demo function: the local time in a well-known city. The model decides to
// call it (it is offered in session.tools); the page runs it here and sends its
// output back as a function_call_output item. Every call gets an output, even
// one for a function the page does not have, so a reply never waits forever.

/** The function as offered in session.tools (OpenAI's Realtime shape). */
export const DEMO_TOOL = Object.freeze({
  type: 'function',
  name: 'get_time_in_city',
  description: 'The current local time in a named city.',
  parameters: {
    type: 'object',
    properties: { city: { type: 'string', description: 'The city' } },
    required: ['city'],
  },
});

/** City (as it is usually written) -> IANA time zone. */
const CITIES = [
  ['Tokyo', 'Asia/Tokyo'],
  ['Osaka', 'Asia/Tokyo'],
  ['Seoul', 'Asia/Seoul'],
  ['Beijing', 'Asia/Shanghai'],
  ['Shanghai', 'Asia/Shanghai'],
  ['Hong Kong', 'Asia/Hong_Kong'],
  ['Taipei', 'Asia/Taipei'],
  ['Singapore', 'Asia/Singapore'],
  ['Bangkok', 'Asia/Bangkok'],
  ['Jakarta', 'Asia/Jakarta'],
  ['Manila', 'Asia/Manila'],
  ['Mumbai', 'Asia/Kolkata'],
  ['New Delhi', 'Asia/Kolkata'],
  ['Bengaluru', 'Asia/Kolkata'],
  ['Kathmandu', 'Asia/Kathmandu'],
  ['Dubai', 'Asia/Dubai'],
  ['Tehran', 'Asia/Tehran'],
  ['Istanbul', 'Europe/Istanbul'],
  ['Moscow', 'Europe/Moscow'],
  ['Athens', 'Europe/Athens'],
  ['Cairo', 'Africa/Cairo'],
  ['Nairobi', 'Africa/Nairobi'],
  ['Lagos', 'Africa/Lagos'],
  ['Johannesburg', 'Africa/Johannesburg'],
  ['Berlin', 'Europe/Berlin'],
  ['Paris', 'Europe/Paris'],
  ['Rome', 'Europe/Rome'],
  ['Madrid', 'Europe/Madrid'],
  ['Amsterdam', 'Europe/Amsterdam'],
  ['Zürich', 'Europe/Zurich'],
  ['Stockholm', 'Europe/Stockholm'],
  ['London', 'Europe/London'],
  ['Dublin', 'Europe/Dublin'],
  ['Lisbon', 'Europe/Lisbon'],
  ['Reykjavík', 'Atlantic/Reykjavik'],
  ['New York', 'America/New_York'],
  ['Boston', 'America/New_York'],
  ['Toronto', 'America/Toronto'],
  ['Chicago', 'America/Chicago'],
  ['Mexico City', 'America/Mexico_City'],
  ['Denver', 'America/Denver'],
  ['Los Angeles', 'America/Los_Angeles'],
  ['San Francisco', 'America/Los_Angeles'],
  ['Vancouver', 'America/Vancouver'],
  ['Honolulu', 'Pacific/Honolulu'],
  ['Bogotá', 'America/Bogota'],
  ['Lima', 'America/Lima'],
  ['São Paulo', 'America/Sao_Paulo'],
  ['Buenos Aires', 'America/Argentina/Buenos_Aires'],
  ['Sydney', 'Australia/Sydney'],
  ['Melbourne', 'Australia/Melbourne'],
  ['Auckland', 'Pacific/Auckland'],
];

/** Other names people (and recognizers) use for the same places. */
const ALIASES = {
  nyc: 'New York',
  'new york city': 'New York',
  la: 'Los Angeles',
  sf: 'San Francisco',
  delhi: 'New Delhi',
  bangalore: 'Bengaluru',
  bombay: 'Mumbai',
  peking: 'Beijing',
  'mexico df': 'Mexico City',
};

/** "São  Paulo!" and "sao paulo" are one key: accents, case and punctuation do not count. */
export function cityKey(name) {
  return String(name ?? '')
    .normalize('NFD')
    .replace(/[\u0300-\u036f]/g, '')
    .toLowerCase()
    .replace(/[^a-z0-9]+/g, ' ')
    .trim();
}

const BY_KEY = new Map(CITIES.map(([city, zone]) => [cityKey(city), { city, zone }]));
for (const [alias, city] of Object.entries(ALIASES)) BY_KEY.set(cityKey(alias), BY_KEY.get(cityKey(city)));

/** {city, zone} for a city name, or null. A leading "the" or trailing "city" is forgiven. */
export function findCity(name) {
  const key = cityKey(name);
  return BY_KEY.get(key) ?? BY_KEY.get(key.replace(/^the /, '').replace(/ city$/, '')) ?? null;
}

/** The output of get_time_in_city for `args` at `now`, as an object. */
export function timeInCity(args, now = new Date()) {
  const asked = typeof args?.city === 'string' ? args.city.trim() : '';
  if (!asked) return { error: 'no city given' };
  const found = findCity(asked);
  if (!found) return { error: `unknown city: ${asked}` };
  // en-US on every browser, so the model reads the same shape whatever the page's locale;
  // ICU's narrow no-break space before AM/PM becomes a plain one (speech engines read it better).
  const time = new Intl.DateTimeFormat('en-US', { timeZone: found.zone, hour: 'numeric', minute: '2-digit' })
    .format(now)
    .replace(/\s/g, ' ');
  const day = new Intl.DateTimeFormat('en-US', { timeZone: found.zone, weekday: 'long' }).format(now);
  return { city: found.city, time_zone: found.zone, local_time: time, day };
}

/**
 * Run the function a function_call names with its JSON `argumentsJson`; the
 * output string for function_call_output. Never throws: any failure is an
 * {"error": ...} output the model can tell the caller about.
 */
export function runTool(name, argumentsJson, now = new Date()) {
  let result;
  if (name !== DEMO_TOOL.name) {
    result = { error: `the page has no function named ${name || '(none)'}` };
  } else {
    let args = null;
    try {
      args = JSON.parse(argumentsJson || '{}');
    } catch {
      args = null;
    }
    result = args && typeof args === 'object' ? timeInCity(args, now) : { error: 'the arguments are not a JSON object' };
  }
  return JSON.stringify(result);
}
