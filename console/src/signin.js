// The sign-in form: a token (admin, operator or an instance's own A2A token) checked against the
// admin API's instance list, which every kind of token may read (an instance token sees its own).

import {ApiError, admin, token} from './api.js';
import {h} from './dom.js';

export function signInPage(view, {reason, done}) {
  const input = h('input', {
    id: 'token-input',
    type: 'password',
    autocomplete: 'off',
    spellcheck: 'false',
    required: true,
    'aria-describedby': 'token-help',
  });
  const message = h('p', {id: 'signin-error', class: 'error', role: 'alert', hidden: !reason}, reason || '');
  const button = h('button', {id: 'signin-submit', type: 'submit'}, 'Sign in');
  const form = h('form', {id: 'signin', class: 'signin', method: 'post'},
    h('h1', {}, 'Sign in'),
    h('label', {for: 'token-input'}, 'Token'),
    input,
    h('p', {id: 'token-help', class: 'help'},
      'An admin, operator or instance token. It stays in this browser tab (sessionStorage) and is ' +
      'sent only to this controller, as a bearer token.'),
    message,
    button);
  form.addEventListener('submit', async (event) => {
    event.preventDefault(); // never a navigation: that would put the token in a URL
    const value = input.value.trim();
    if (!value) return;
    button.disabled = true;
    token.set(value);
    input.value = '';
    try {
      await admin.instances();
      done();
    } catch (error) {
      token.clear();
      message.hidden = false;
      message.textContent = error instanceof ApiError && error.status === 401
        ? 'The controller refused this token.'
        : `The token could not be checked: ${error.message}`;
      button.disabled = false;
      input.focus();
    }
  });
  view.append(form);
  input.focus();
  return {dispose() {}};
}
